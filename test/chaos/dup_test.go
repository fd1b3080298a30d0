package chaos

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// republisher duplicates messages: it keeps a copy of every result and
// task message the cluster publishes (a core subscription sees each one as
// the server stores it) and, until stopped, publishes a random earlier one
// again — same subject, data and headers, but a new Nats-Msg-Id so that the
// server stores it instead of discarding it as a duplicate. A scheduler
// must drop the old results as stale; an agent handed an old task may run
// it again (counted as a duplicate execution), but its result is stale too.
//
// Tasks of the poison action are not repeated: each would kill an agent
// again, which the test cannot tell from the poison itself.
type republisher struct {
	mu               sync.Mutex
	results, tasks   []*nats.Msg
	republished      map[string]int // "results", "tasks"
	errors           int
	stop             chan struct{}
	done             chan struct{}
	subRes, subTasks *nats.Subscription
}

const keepMsgs = 4000

func startRepublisher(nc *nats.Conn, js jetstream.JetStream, seed int64) (*republisher, error) {
	r := &republisher{republished: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	keep := func(into *[]*nats.Msg, rnd *rand.Rand) nats.MsgHandler {
		return func(m *nats.Msg) {
			if m.Header.Get(protocol.HeaderAction) == "crash" {
				return
			}
			c := &nats.Msg{Subject: m.Subject, Data: append([]byte(nil), m.Data...), Header: nats.Header{}}
			for k, v := range m.Header {
				c.Header[k] = append([]string(nil), v...)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(*into) < keepMsgs {
				*into = append(*into, c)
			} else {
				(*into)[rnd.IntN(keepMsgs)] = c
			}
		}
	}
	var err error
	if r.subRes, err = nc.Subscribe(protocol.SubjectResultPrefix+".>", keep(&r.results, rand.New(rand.NewPCG(uint64(seed), 1)))); err != nil {
		return nil, err
	}
	if r.subTasks, err = nc.Subscribe(protocol.SubjectTaskPrefix+".>", keep(&r.tasks, rand.New(rand.NewPCG(uint64(seed), 2)))); err != nil {
		return nil, err
	}
	go r.run(js, rand.New(rand.NewPCG(uint64(seed), 0xd0b)))
	return r, nil
}

func (r *republisher) run(js jetstream.JetStream, rnd *rand.Rand) {
	defer close(r.done)
	n := 0
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(time.Duration(100+rnd.IntN(300)) * time.Millisecond):
		}
		kind := "results"
		r.mu.Lock()
		pool := r.results
		if rnd.IntN(3) == 0 {
			kind, pool = "tasks", r.tasks
		}
		if len(pool) == 0 {
			r.mu.Unlock()
			continue
		}
		orig := pool[rnd.IntN(len(pool))]
		m := &nats.Msg{Subject: orig.Subject, Data: orig.Data, Header: nats.Header{}}
		for k, v := range orig.Header {
			m.Header[k] = v
		}
		r.mu.Unlock()
		n++
		id := orig.Header.Get(protocol.HeaderMsgID)
		if id == "" {
			id = "chaos"
		}
		m.Header.Set(protocol.HeaderMsgID, id+"-dup-"+strconv.Itoa(n))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.PublishMsg(ctx, m)
		cancel()
		r.mu.Lock()
		if err == nil {
			r.republished[kind]++
		} else {
			r.errors++
		}
		r.mu.Unlock()
	}
}

// finish stops republishing and returns how many results and tasks were
// stored again.
func (r *republisher) finish() (results, tasks int) {
	close(r.stop)
	<-r.done
	_ = r.subRes.Unsubscribe()
	_ = r.subTasks.Unsubscribe()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.republished["results"], r.republished["tasks"]
}
