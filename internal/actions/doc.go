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
//   - The task does not choose the program: a command is found with the
//     agent's PATH or is an absolute path (never relative to the task's
//     dir). Nor, through its env, the code the program loads: the env may
//     not set PATH, LD_*, DYLD_*, BASH_FUNC_*, the other loader and shell
//     start-up variables, or a name that is not letters, digits and '_';
//     tool options and config locations such as MAKEFLAGS, GIT_*, HOME and
//     XDG_* only when shell.allowed_env lists them, and only names it lists
//     when it is set. The task's args are the program's to interpret, and
//     most programs run any code they are asked to through them (git -c
//     alias.x='!cmd' x, find -exec, make --eval): only a command with
//     shell.allowed_args entries is held to argument lists they match. Nor
//     do files in the task's dir stay unread (a Makefile, .git/config).
//   - A command runs in a process group of its own; when its context ends
//     the whole group is killed, so nothing it started outlives a timeout,
//     deadline, cancel or lost lease to run beside the retry. On Linux the
//     command is also killed if the agent dies (its own children are not).
//   - http talks only to hosts in http.allowed_hosts when that list is set,
//     at every redirect too.
//   - Error texts show a URL without its password, query values or
//     fragment.
//   - Every action honours its context: it returns soon after the context
//     ends, with the context's cause.
//
// Errors that must not be retried implement ErrorClass() string returning
// "permanent"; pkg/agent reads that interface, so the class crosses the
// package boundary without an import cycle.
package actions
