package actions

import (
	"context"
	"encoding/json"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// SleepParams are the parameters of sleep.
type SleepParams struct {
	// Duration to sleep, e.g. "2s". Required.
	Duration protocol.Duration `json:"duration"`
}

// SleepOutput is sleep's output.
type SleepOutput struct {
	Slept protocol.Duration `json:"slept"`
}

// Sleep waits for the duration or until ctx ends, whichever comes first.
func Sleep(ctx context.Context, params json.RawMessage) (any, error) {
	var p SleepParams
	if err := Decode(params, &p); err != nil {
		return nil, err
	}
	if p.Duration <= 0 {
		return nil, Permanentf("%w: field \"duration\" is required and must be positive", ErrInvalidParams)
	}
	start := time.Now()
	t := time.NewTimer(p.Duration.Std())
	defer t.Stop()
	select {
	case <-t.C:
		return SleepOutput{Slept: p.Duration}, nil
	case <-ctx.Done():
		return SleepOutput{Slept: protocol.Duration(time.Since(start))}, context.Cause(ctx)
	}
}
