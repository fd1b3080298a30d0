// Package actions holds the built-in actions an agent can run: echo, sleep,
// shell and http. An action is a plain function of its JSON parameters, so
// this package does not depend on the agent runtime; pkg/agent registers the
// built-ins an agent's configuration allows.
//
// Guarantees:
//   - Parameters are decoded strictly: an unknown field, a wrong type or a
//     missing required field is a permanent error naming the field, never a
//     silently ignored typo.
//   - shell runs only commands listed, string for string, in
//     shell.allowed_commands, without a shell (no globbing, no expansion),
//     with an environment made of PATH plus the task's env (the agent's own
//     environment, which may hold credentials, is not passed on).
//   - http talks only to hosts in http.allowed_hosts when that list is set.
//   - Every action honours its context: it returns soon after the context
//     ends, with the context's cause.
//
// Errors that must not be retried implement ErrorClass() string returning
// "permanent"; pkg/agent reads that interface, so the class crosses the
// package boundary without an import cycle.
package actions
