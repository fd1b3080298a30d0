package actions

import (
	"context"
	"encoding/json"
)

// Echo returns its parameters unchanged as the output; it checks the whole
// path from scheduler to agent and back.
func Echo(_ context.Context, params json.RawMessage) (any, error) {
	if len(params) == 0 {
		return json.RawMessage("{}"), nil
	}
	if !json.Valid(params) {
		return nil, Permanentf("%w: not valid JSON", ErrInvalidParams)
	}
	return params, nil
}
