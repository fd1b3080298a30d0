// Package handagent is the scheduler's and supervisor's tests' old
// scripted agent, now a thin adapter over pkg/agent/agenttest: a real SDK
// agent whose handler the test scripts. It keeps the old API (replies as
// protocol.Result, Drop) so those tests did not have to change; new tests
// should use agenttest.StartAgent directly.
package handagent
