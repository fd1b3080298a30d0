package bench

import "strings"

func splitFields(s string) []string { return strings.Fields(s) }

func joinFields(f []string) string { return strings.Join(f, " ") }
