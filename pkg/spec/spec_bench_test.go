package spec_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/spec"
)

func chainJSON(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"name":"chain","steps":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"id":"s%d","action":"echo","params":{"message":"hi"}`, i)
		if i > 0 {
			fmt.Fprintf(&b, `,"depends_on":["s%d"]`, i-1)
		}
		b.WriteString("}")
	}
	b.WriteString("]}")
	return []byte(b.String())
}

const yamlSpec = `name: build
steps:
  - id: lint
    action: shell
    params: {command: make, args: [lint]}
  - id: test
    action: shell
    depends_on: [lint]
    timeout: 10m
    params: {command: make, args: [test]}
  - id: package
    action: shell
    depends_on: [test]
    requires: [linux]
`

// BenchmarkParse is spec decode and validation as the scheduler runs it
// on every submission.
func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"json_1_step", chainJSON(1)},
		{"json_10_steps", chainJSON(10)},
		{"json_100_steps", chainJSON(100)},
		{"yaml_3_steps", []byte(yamlSpec)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := spec.Parse(c.body, spec.DefaultLimits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate is validation alone (ids, references, cycles).
func BenchmarkValidate(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		j, err := spec.Parse(chainJSON(n), spec.DefaultLimits)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("steps_%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := j.Validate(spec.DefaultLimits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
