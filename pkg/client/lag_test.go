package client_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/protocol"
)

// A replica behind the stream's leader may answer the batched read of a
// job's steps after an up-to-date one answered its record: Job reads the
// steps again, as it reads the record again, rather than failing with
// ErrBehindLeader (which the CLI reports as a conflict, exit 2, the
// answer for a job in the wrong state). Here the direct gets are played by
// hand: single-key gets from the leader, the first batched get by a
// replica that has nothing yet, after which the stream answers them
// itself again.
//
// Old code: "Job: … read answered by a replica behind the stream leader".
func TestJobReadsItsStepsAgainWhenAReplicaLags(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "job-lag"
	materialise(t, b, id, diamond, time.Now())
	stream := "KV_" + protocol.BucketJobs
	s, err := b.js.Stream(ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := b.js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Single-key gets: an up-to-date replica (the leader's answer).
	single, err := nc.Subscribe("$JS.API.DIRECT.GET."+stream+".>", func(m *nats.Msg) {
		subj := strings.TrimPrefix(m.Subject, "$JS.API.DIRECT.GET."+stream+".")
		req, _ := json.Marshal(map[string]string{"last_by_subj": subj})
		go func() {
			r := nats.NewMsg(m.Reply)
			var out struct {
				Message *struct {
					Subject string `json:"subject"`
					Seq     uint64 `json:"seq"`
					Data    []byte `json:"data"`
				} `json:"message"`
			}
			resp, err := nc.Request("$JS.API.STREAM.MSG.GET."+stream, req, 5*time.Second)
			if err != nil || json.Unmarshal(resp.Data, &out) != nil || out.Message == nil {
				r.Header.Set("Status", "404")
			} else {
				r.Header.Set("Nats-Subject", out.Message.Subject)
				r.Header.Set("Nats-Sequence", strconv.FormatUint(out.Message.Seq, 10))
				r.Data = out.Message.Data
			}
			_ = nc.PublishMsg(r)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first batched get: a replica that has nothing yet. Then the
	// stream serves direct gets itself again.
	var once sync.Once
	restored := make(chan struct{})
	batched, err := nc.Subscribe("$JS.API.DIRECT.GET."+stream, func(m *nats.Msg) {
		once.Do(func() {
			r := nats.NewMsg(m.Reply)
			r.Header.Set("Status", "404")
			_ = nc.PublishMsg(r)
			go func() {
				defer close(restored)
				_ = nc.Drain()
				cfg.AllowDirect = true
				if _, err := b.js.UpdateStream(ctx(t), cfg); err != nil {
					t.Error(err)
				}
			}()
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = single.Unsubscribe(); _ = batched.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d, err := b.client.Job(ctx(t), id)
	<-restored
	if err != nil {
		t.Fatalf("Job: %v", err)
	}
	if len(d.Steps) != 4 {
		t.Fatalf("Job read %d steps, want the diamond's 4", len(d.Steps))
	}
}
