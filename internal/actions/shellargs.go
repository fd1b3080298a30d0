package actions

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
)

// ErrArgsNotAllowed is wrapped when a command's args match none of its
// shell.allowed_args entries.
var ErrArgsNotAllowed = errors.New("args not allowed")

// argPatterns are a command's allowed_args entries, compiled: an argument
// list is allowed when it has as many arguments as one entry and each
// argument matches the whole of its pattern.
type argPatterns [][]*regexp.Regexp

// compileArgs compiles allowed_args, checking it as Validate does: every
// command listed in allowed_commands, at least one entry each, every
// pattern valid. Its errors name the entry: "shell.allowed_args[git][1][0]".
func compileArgs(allowed map[string][][]string, commands []string) (map[string]argPatterns, error) {
	compiled := make(map[string]argPatterns, len(allowed))
	for _, cmd := range slices.Sorted(maps.Keys(allowed)) {
		lists := allowed[cmd]
		if !slices.Contains(commands, cmd) {
			return nil, fmt.Errorf("shell.allowed_args[%s]: %q is not in shell.allowed_commands", cmd, cmd)
		}
		if len(lists) == 0 {
			return nil, fmt.Errorf("shell.allowed_args[%s]: must list at least one argument list ([[]] allows running it without arguments only)", cmd)
		}
		ps := make(argPatterns, len(lists))
		for i, list := range lists {
			ps[i] = make([]*regexp.Regexp, len(list))
			for j, pat := range list {
				re, err := regexp.Compile(`^(?:` + pat + `)$`)
				if err != nil {
					return nil, fmt.Errorf("shell.allowed_args[%s][%d][%d]: %w", cmd, i, j, err)
				}
				ps[i][j] = re
			}
		}
		compiled[cmd] = ps
	}
	return compiled, nil
}

// allows reports whether args match one of ps's entries.
func (ps argPatterns) allows(args []string) bool {
	return slices.ContainsFunc(ps, func(list []*regexp.Regexp) bool {
		if len(list) != len(args) {
			return false
		}
		for i, re := range list {
			if !re.MatchString(args[i]) {
				return false
			}
		}
		return true
	})
}

// checkArgs returns a permanent error when command has allowed_args entries
// (or they are invalid, cfgErr) and args match none of them.
func checkArgs(command string, args []string, allowed map[string]argPatterns, cfgErr error) error {
	if cfgErr != nil {
		return Permanentf("%w: %w", ErrArgsNotAllowed, cfgErr)
	}
	ps, ok := allowed[command]
	if !ok || ps.allows(args) {
		return nil
	}
	return Permanentf("%w: %q for %s match none of the %d entries of shell.allowed_args[%s]", ErrArgsNotAllowed, args, command, len(ps), command)
}
