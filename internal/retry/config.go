package retry

import "time"

// Config is configs/retry.yaml: the retry policies and the classification.
type Config struct {
	Policies `yaml:",inline"`
	// Classification decides which failures are retried.
	Classification Classification `yaml:"classification" json:"classification"`
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{Policies: DefaultPolicies(), Classification: DefaultClassification()}
}

// WithDefaults fills the zero fields whose zero value is not meaningful.
func (c Config) WithDefaults() Config {
	c.Policies = c.Policies.WithDefaults()
	c.Classification = c.Classification.WithDefaults()
	return c
}

// Validate reports the first field that breaks a rule.
func (c Config) Validate() error {
	if err := c.Policies.Validate(); err != nil {
		return err
	}
	return c.Classification.Validate()
}

// Decide classifies a failure with c.Classification and says whether and
// when a step running action, with the step's own override (nil: none),
// that failed after retriesDone retries is tried again.
func (c Config) Decide(action string, step *Override, retriesDone int, class, errText string,
	retryAfter time.Duration, rnd func() float64) (Decision, time.Duration, bool) {
	d := Classify(class, errText, retryAfter, c.Classification)
	delay, ok := c.Resolve(action, step).Next(retriesDone, d, rnd)
	return d, delay, ok
}
