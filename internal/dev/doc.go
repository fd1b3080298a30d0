// Package dev runs the whole of Warden on one machine for `warden dev`: an
// embedded NATS server with JetStream (data in a local folder), Warden's
// streams and buckets, and the scheduler, supervisor and agents as child
// processes of the real binaries, their output prefixed with their names.
//
// Guarantees:
//   - Children are the same binaries a deployment runs, found next to the
//     warden executable; nothing is simulated in-process.
//   - Run returns only after every child has exited (SIGTERM, then SIGKILL
//     after Config.ShutdownTimeout) and the server has shut down, so no
//     process outlives `warden dev` and the data folder is consistent.
//   - Children run in their own process group, so a terminal's Ctrl-C
//     reaches only `warden dev`, which stops them in order: agents and
//     services first, the server they need last.
package dev
