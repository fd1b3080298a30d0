//go:build !unix

package presence

import "time"

// cpuTime is not available here: utilisation is not reported.
func cpuTime() (time.Duration, bool) { return 0, false }
