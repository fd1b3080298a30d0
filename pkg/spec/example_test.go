package spec_test

import (
	"errors"
	"fmt"

	"github.com/wardenhq/warden/pkg/spec"
)

// Parse decodes and validates a spec; what it accepts can run as it is.
func ExampleParse() {
	job, err := spec.Parse([]byte(`
name: deploy
steps:
  - {id: build, action: shell, params: {command: make}}
  - {id: test, action: shell, depends_on: [build]}
`), spec.DefaultLimits)
	if err != nil {
		panic(err)
	}
	fmt.Println(job.Name, len(job.Steps), job.Steps[1].DependsOn)
	// Output: deploy 2 [build]
}

// An invalid spec is a *ValidationError whose Reason is a stable code.
func ExampleParse_invalid() {
	_, err := spec.Parse([]byte(`
name: loop
steps:
  - {id: a, action: echo, depends_on: [b]}
  - {id: b, action: echo, depends_on: [a]}
`), spec.DefaultLimits)
	fmt.Println(errors.Is(err, spec.ErrInvalid), spec.ReasonOf(err) == spec.ReasonCycle)
	// Output: true true
}
