package retry_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/protocol"
)

func TestNominal(t *testing.T) {
	t.Parallel()
	p := retry.DefaultPolicy()
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	for n, w := range want {
		if got := p.Nominal(n); got != w*time.Second {
			t.Errorf("Nominal(%d) = %s, want %s", n, got, w*time.Second)
		}
	}
	if got := p.Nominal(-3); got != time.Second {
		t.Errorf("Nominal(-3) = %s, want 1s", got)
	}
	if got := p.Nominal(1 << 30); got != 300*time.Second {
		t.Errorf("Nominal(huge) = %s, want the cap", got)
	}
	flat := p
	flat.Multiplier = 1
	if got := flat.Nominal(50); got != time.Second {
		t.Errorf("multiplier 1: Nominal(50) = %s, want 1s", got)
	}
}

func TestDelayExtremes(t *testing.T) {
	t.Parallel()
	p := retry.DefaultPolicy()
	cases := []struct {
		n    int
		u    float64
		want time.Duration
	}{
		{0, 0, 800 * time.Millisecond},
		{0, 0.5, time.Second},
		{0, 1, 1200 * time.Millisecond},
		{0, -5, 800 * time.Millisecond}, // clamped
		{0, 7, 1200 * time.Millisecond}, // clamped
		{3, 0.5, 8 * time.Second},
		{20, 0, 240 * time.Second}, // max × (1 − jitter)
		{20, 1, 360 * time.Second}, // max × (1 + jitter): jitter applies after the cap
	}
	for _, c := range cases {
		if got := p.Delay(c.n, func() float64 { return c.u }); got != c.want {
			t.Errorf("Delay(%d, %g) = %s, want %s", c.n, c.u, got, c.want)
		}
	}
	none := p
	none.Jitter = 0
	if got := none.Delay(2, rand.Float64); got != 4*time.Second {
		t.Errorf("no jitter: Delay(2) = %s, want 4s", got)
	}
	if got := p.Delay(0, nil); got < 800*time.Millisecond || got > 1200*time.Millisecond {
		t.Errorf("nil rnd: Delay(0) = %s, outside [0.8s, 1.2s]", got)
	}
}

// TestDelaySpread draws 10,000 delays per retry: all within the bounds, the
// mean near the nominal delay, both halves and both outer tenths of the
// range reached.
// TestDelayNeverNegative: a bad random value (NaN, ±Inf) or a policy that
// fails Validate must not make a retry due before the failure it follows.
func TestDelayNeverNegative(t *testing.T) {
	t.Parallel()
	p := retry.DefaultPolicy()
	for _, u := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		got := p.Delay(0, func() float64 { return u })
		if got < 800*time.Millisecond || got > 1200*time.Millisecond {
			t.Errorf("Delay(0, %g) = %s, want within [0.8s, 1.2s]", u, got)
		}
	}
	if got := p.Delay(0, func() float64 { return math.NaN() }); got != time.Second {
		t.Errorf("Delay(0, NaN) = %s, want the nominal 1s (NaN means no jitter)", got)
	}
	bad := func(edit func(*retry.Policy)) retry.Policy {
		q := retry.DefaultPolicy()
		edit(&q)
		return q
	}
	for name, q := range map[string]retry.Policy{
		"jitter 3":          bad(func(q *retry.Policy) { q.Jitter = 3 }),
		"jitter NaN":        bad(func(q *retry.Policy) { q.Jitter = math.NaN() }),
		"negative backoff":  bad(func(q *retry.Policy) { q.BaseBackoff = -protocol.Duration(time.Second) }),
		"max_backoff limit": bad(func(q *retry.Policy) { q.BaseBackoff, q.MaxBackoff = math.MaxInt64, math.MaxInt64 }),
	} {
		for _, u := range []float64{0, 0.5, 1, math.NaN()} {
			if got := q.Delay(0, func() float64 { return u }); got < 0 {
				t.Errorf("%s: Delay(0, %g) = %s, want ≥ 0", name, u, got)
			}
		}
	}
}

func TestDelaySpread(t *testing.T) {
	t.Parallel()
	p := retry.DefaultPolicy()
	r := rand.New(rand.NewPCG(1, 2))
	const draws = 10_000
	for _, n := range []int{0, 1, 4, 9, 12} {
		nominal := float64(p.Nominal(n))
		lo, hi := nominal*(1-p.Jitter), nominal*(1+p.Jitter)
		var sum float64
		var below, above, lowTenth, highTenth int
		for range draws {
			d := float64(p.Delay(n, r.Float64))
			if d < lo || d > hi {
				t.Fatalf("retry %d: delay %s outside [%s, %s]", n, time.Duration(d), time.Duration(lo), time.Duration(hi))
			}
			sum += d
			if d < nominal {
				below++
			} else {
				above++
			}
			if d < lo+(hi-lo)/10 {
				lowTenth++
			}
			if d > hi-(hi-lo)/10 {
				highTenth++
			}
		}
		mean := sum / draws
		if math.Abs(mean-nominal)/nominal > 0.01 {
			t.Errorf("retry %d: mean %s, want within 1%% of %s", n, time.Duration(mean), time.Duration(nominal))
		}
		// Uniform: each half holds ~50%, each outer tenth ~10%.
		if below < draws*45/100 || above < draws*45/100 {
			t.Errorf("retry %d: %d below and %d above nominal, want both near half", n, below, above)
		}
		if lowTenth < draws*8/100 || highTenth < draws*8/100 {
			t.Errorf("retry %d: outer tenths hit %d and %d times, want ~%d each", n, lowTenth, highTenth, draws/10)
		}
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	p := retry.DefaultPolicy()
	p.Jitter = 0
	retriable := retry.Decision{Retriable: true, Class: "timeout"}
	if d, ok := p.Next(0, retriable, nil); !ok || d != time.Second {
		t.Errorf("first retry: %s %v, want 1s true", d, ok)
	}
	if d, ok := p.Next(2, retriable, nil); !ok || d != 4*time.Second {
		t.Errorf("third retry: %s %v, want 4s true", d, ok)
	}
	if _, ok := p.Next(3, retriable, nil); ok {
		t.Error("retry after max_retries retries: want none")
	}
	if _, ok := p.Next(0, retry.Decision{Class: "not_found"}, nil); ok {
		t.Error("permanent failure retried")
	}
	asked := retry.Decision{Retriable: true, Class: retry.ClassRetriable, After: time.Minute}
	if d, _ := p.Next(0, asked, nil); d != time.Minute {
		t.Errorf("retry-after 1m: delay %s, want 1m", d)
	}
	many := p
	many.MaxRetries = 20
	if d, _ := many.Next(8, asked, nil); d != 256*time.Second {
		t.Errorf("retry-after shorter than backoff: delay %s, want the backoff 256s", d)
	}
	zero := p
	zero.MaxRetries = 0
	if _, ok := zero.Next(0, retriable, nil); ok {
		t.Error("max_retries 0 retried")
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	five, zero := 5, 0
	two := protocol.Duration(2 * time.Second)
	noJitter := 0.0
	ps := retry.DefaultPolicies()
	ps.ByAction = map[string]retry.Override{
		"http":  {MaxRetries: &five, BaseBackoff: &two},
		"shell": {MaxRetries: &zero},
	}
	if err := ps.Validate(); err != nil {
		t.Fatal(err)
	}
	def := retry.DefaultPolicy()
	if got := ps.Resolve("echo", nil); got != def {
		t.Errorf("echo: %+v, want the default %+v", got, def)
	}
	http := ps.Resolve("http", nil)
	if http.MaxRetries != 5 || http.BaseBackoff != two || http.Multiplier != 2 || http.Jitter != 0.2 {
		t.Errorf("http: %+v", http)
	}
	step := ps.Resolve("http", &retry.Override{MaxRetries: &zero, Jitter: &noJitter})
	if step.MaxRetries != 0 || step.BaseBackoff != two || step.Jitter != 0 {
		t.Errorf("http with step override: %+v", step)
	}
	if got := ps.Resolve("shell", &retry.Override{}); got.MaxRetries != 0 {
		t.Errorf("shell with empty step override: %+v", got)
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	neg := -1
	cases := []struct {
		name string
		edit func(*retry.Policies)
		want string
	}{
		{"defaults", func(*retry.Policies) {}, ""},
		{"negative retries", func(p *retry.Policies) { p.Default.MaxRetries = -1 }, "default.max_retries"},
		{"too many retries", func(p *retry.Policies) { p.Default.MaxRetries = 101 }, "default.max_retries"},
		{"zero base", func(p *retry.Policies) { p.Default.BaseBackoff = 0 }, "default.base_backoff"},
		{"shrinking", func(p *retry.Policies) { p.Default.Multiplier = 0.5 }, "default.multiplier"},
		{"max below base", func(p *retry.Policies) { p.Default.MaxBackoff = protocol.Duration(time.Millisecond) }, "default.max_backoff"},
		{"jitter above 1", func(p *retry.Policies) { p.Default.Jitter = 1.5 }, "default.jitter"},
		{"bad action", func(p *retry.Policies) {
			p.ByAction = map[string]retry.Override{"http": {MaxRetries: &neg}}
		}, "actions.http.max_retries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ps := retry.DefaultPolicies()
			c.edit(&ps)
			err := ps.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to name %s", err, c.want)
			}
		})
	}
}

func TestPolicyWithDefaults(t *testing.T) {
	t.Parallel()
	got := retry.Policy{MaxRetries: 2}.WithDefaults()
	want := retry.Policy{MaxRetries: 2, BaseBackoff: protocol.Duration(time.Second), Multiplier: 2,
		MaxBackoff: protocol.Duration(300 * time.Second), Jitter: 0}
	if got != want {
		t.Fatalf("%+v, want %+v (max_retries and jitter keep their zero)", got, want)
	}
}
