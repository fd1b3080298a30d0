package retry_test

import (
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/retry"
)

func TestRetriable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		class, msg string
		def, want  bool
	}{
		{protocol.ClassRetriable, "invalid params", false, true},
		{protocol.ClassPermanent, "connection refused", true, false},
		{"", "dial tcp: connection refused", false, true},
		{"", "read: connection reset by peer", false, true},
		{"", "context deadline exceeded", false, true},
		{"", "service unavailable (503)", false, true},
		{"", "invalid parameter: timeout must be positive", true, false},
		{"", "open /etc/x: permission denied", true, false},
		{"", "unknown action \"x\"", true, false},
		{"", "exit status 3", false, false},
		{"", "exit status 3", true, true},
	}
	for _, c := range cases {
		if got := retry.Retriable(c.class, c.msg, c.def); got != c.want {
			t.Errorf("Retriable(%q, %q, %v) = %v, want %v", c.class, c.msg, c.def, got, c.want)
		}
	}
}
