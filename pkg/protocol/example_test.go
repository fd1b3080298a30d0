package protocol_test

import (
	"errors"
	"fmt"

	"github.com/wardenhq/warden/pkg/protocol"
)

// A control reply's error is compared by its code, never by its text.
func ExampleParseReply() {
	_, err := protocol.ParseReply([]byte(`{"error":{"code":"not_found","message":"step j.s at epoch 3 is not running here"}}`))
	fmt.Println(errors.Is(err, protocol.ErrNotFound))
	fmt.Println(err)
	// Output:
	// true
	// not_found: step j.s at epoch 3 is not running here
}

// Any client can compute where an agent's tasks and a job's messages live:
// FNV-1a, as the server's partition() subject transform.
func ExampleShard() {
	shard := protocol.Shard("manual", "hand-2", 4)
	fmt.Println(protocol.TaskSubject(shard, "manual", "hand-2"))
	fmt.Println(protocol.TaskStream(shard))
	// Output:
	// warden.task.1.manual.hand-2
	// WARDEN_TASKS_1
}
