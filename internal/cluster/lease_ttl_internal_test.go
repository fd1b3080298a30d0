package cluster

import (
	"testing"
	"time"
)

// What a lease write sends and how long its key lives: whole seconds, at
// least one, at most the bucket's max age.
func TestKeyTTL(t *testing.T) {
	t.Parallel()
	const s, ms = time.Second, time.Millisecond
	for _, c := range []struct {
		want, bucket, send, lives time.Duration
	}{
		{3 * s, 5 * s, 3 * s, 3 * s},
		{3 * s, 0, 3 * s, 3 * s},
		{1500 * ms, 5 * s, 1 * s, 1 * s},
		{2999 * ms, 0, 2 * s, 2 * s},
		{30 * s, 5 * s, 5 * s, 5 * s},      // cut to the bucket
		{3 * s, 2500 * ms, 2 * s, 2 * s},   // a fractional bucket max age: its whole seconds
		{3 * s, 500 * ms, 1 * s, 500 * ms}, // below the server's minimum TTL: the bucket removes it first
		{500 * ms, 0, 1 * s, 1 * s},        // never sent below the minimum
	} {
		send, lives := keyTTL(c.want, c.bucket)
		if send != c.send || lives != c.lives {
			t.Errorf("keyTTL(%s, %s) = %s, %s; want %s, %s", c.want, c.bucket, send, lives, c.send, c.lives)
		}
		if send%s != 0 {
			t.Errorf("keyTTL(%s, %s) sends %s: the server would drop the fraction", c.want, c.bucket, send)
		}
	}
}
