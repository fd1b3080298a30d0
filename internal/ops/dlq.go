package ops

import (
	"context"

	"github.com/wardenhq/warden/internal/dlq"
)

// MaxLetterPage is the most dead letters one DeadLetterPage returns.
const MaxLetterPage = dlq.MaxPage

// DeadLetterPage lists up to limit dead letters whose id is above after,
// oldest first, as summaries (dlq.Queue.Page).
func (o *Ops) DeadLetterPage(ctx context.Context, after uint64, limit int) ([]dlq.Summary, error) {
	q, err := o.dlq(ctx)
	if err != nil {
		return nil, err
	}
	return q.Page(ctx, after, limit)
}
