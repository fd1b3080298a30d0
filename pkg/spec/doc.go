// Package spec owns the job specification users submit, in YAML or JSON, and
// its validation. A spec that passes Validate can be materialised into a job
// without further checks: step ids are unique subject tokens, every
// dependency exists and the dependency graph is acyclic.
package spec
