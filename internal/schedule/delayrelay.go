package schedule

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// DelayRelayConsumer is the durable consumer every scheduler's delay relay
// shares on WARDEN_DELAY.
const DelayRelayConsumer = "delay-relay"

// RunDelayRelay submits released delayed submissions (warden.delayed.<job>
// in WARDEN_DELAY) on warden.submit.<job>, marked HeaderReleased so that
// they are not delayed again, until ctx ends. Every scheduler runs one;
// they share a durable consumer, which is created again if the server
// loses it meanwhile (package keep). A release is acked only once its
// submission is stored; its Nats-Msg-Id (released.<job>.<sequence>) makes
// a redelivered one a duplicate.
func RunDelayRelay(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) error {
	k := keptRelayConsumer(js, protocol.StreamDelay, delayRelayConsumerConfig(), func(m jetstream.Msg) {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleTimeout)
		defer cancel()
		settle(m, submitReleased(hctx, js, m), log, "released delayed submission")
	}, log)
	if err := k.Start(ctx); err != nil {
		return err
	}
	keepUntil(ctx, k)
	return nil
}

// delayRelayConsumerConfig is the durable consumer of released delayed
// submissions.
func delayRelayConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       DelayRelayConsumer,
		Description:   "Shared by every scheduler: released delayed submissions, submitted again on warden.submit.",
		FilterSubject: protocol.DelayedSubject("*"),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 1024,
	}
}

// submitReleased submits one released delayed submission.
func submitReleased(ctx context.Context, js jetstream.JetStream, m jetstream.Msg) error {
	job := strings.TrimPrefix(m.Subject(), protocol.SubjectDelayedPrefix+".")
	if !protocol.ValidToken(job) {
		return nil // not a release Warden made: nothing to submit
	}
	md, err := m.Metadata()
	if err != nil {
		return err
	}
	s := Resubmission(job, m.Data(), m.Headers())
	s.Header.Set(protocol.HeaderReleased, "1")
	s.Header.Set(protocol.HeaderMsgID, "released."+job+"."+strconv.FormatUint(md.Sequence.Stream, 10))
	if _, err := js.PublishMsg(ctx, s); err != nil {
		return fmt.Errorf("submit %s: %w", job, err)
	}
	return nil
}
