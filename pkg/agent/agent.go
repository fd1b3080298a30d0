package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/agent/internal/testhook"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Version is reported in presence; set it with -ldflags "-X github.com/wardenhq/warden/pkg/agent.Version=...".
var Version = "dev"

// Agent runs registered and built-in actions for tasks addressed to it.
type Agent struct {
	cfg     Config
	log     zerolog.Logger
	logSet  bool
	now     func() time.Time
	nc      *nats.Conn // set by WithConn, or by Run
	ownConn bool

	mu       sync.Mutex
	handlers map[string]HandlerFunc
	started  bool

	// Set by Run before any worker starts.
	allowed      map[string]HandlerFunc
	allowedNames []string
	js           jetstream.JetStream
	cons         jetstream.Consumer
	ghosts       ghostCheck // only dispatch touches it
	depth        depthProbe // only dispatch touches it
	shard        int
	host         string
	startedAt    time.Time
	ready        chan struct{}

	draining atomic.Bool
	stats    counters
	iso      *isolation
	// held is set by an operator's drain: no new task is fetched.
	held atomic.Bool
	// limit is how many tasks run at once: max_concurrent, or less when
	// the supervisor reduces the load of an unhealthy agent.
	limit   atomic.Int32
	running sync.Map // "<job>.<step>.<epoch>" -> *runningTask
	// reported are the results this agent stored lately (recent.go).
	reported *recentReports
	// cancels are cancel orders for dispatches not running here (cancels.go).
	cancels *earlyCancels
	// pullCancel ends the pull request in progress (dispatch.go).
	pullCancel atomic.Pointer[context.CancelFunc]
	// reconnected cuts short a retry's wait after a failed pull
	// (repullOnReconnect).
	reconnected chan struct{}
	// hooks are test-only behaviours (pkg/agent/agenttest); nil otherwise.
	hooks *testhook.Hooks
	// clu is the agent's cluster membership (cluster.go), when configured.
	clu atomic.Pointer[clusterMember]
}

// Option configures an Agent.
type Option func(*Agent)

// WithLogger sets the logger. Defaults to logging.New("agent", cfg.LogLevel).
func WithLogger(l zerolog.Logger) Option { return func(a *Agent) { a.log, a.logSet = l, true } }

// WithConn makes the agent use nc instead of connecting with cfg.NATS. The
// caller keeps ownership: Run does not close it.
func WithConn(nc *nats.Conn) Option { return func(a *Agent) { a.nc = nc } }

// WithClock sets the clock used for deadlines, leases and timestamps.
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// New checks cfg (after filling its defaults) and returns an Agent.
func New(cfg Config, opts ...Option) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	a := &Agent{cfg: cfg, now: time.Now, handlers: map[string]HandlerFunc{}, ready: make(chan struct{}), reconnected: make(chan struct{}, 1), iso: newIsolation(cfg.MaxConcurrent),
		reported: newRecentReports(recentReportsKept, recentReportBytes), cancels: newEarlyCancels()}
	a.limit.Store(int32(cfg.MaxConcurrent))
	for _, o := range opts {
		o(a)
	}
	if !a.logSet {
		// Only without WithLogger: logging.New also sets zerolog globals.
		a.log = logging.New("agent", cfg.LogLevel)
	}
	a.log = a.log.With().Str(logging.FieldAgent, cfg.ID).Str("pool", cfg.Pool).Logger()
	return a, nil
}

// Config is the agent's configuration with defaults filled in.
func (a *Agent) Config() Config { return a.cfg }

// Handle registers h for action. A registered handler replaces a built-in of
// the same name. It runs only if the configuration allows the action (see
// Config.Actions). Handle panics on an invalid name, a nil handler, a second
// registration or a call after Run, like http.HandleFunc: these are
// programming errors.
func (a *Agent) Handle(action string, h HandlerFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.started:
		panic("agent: Handle called after Run")
	case !protocol.ValidToken(action):
		panic(fmt.Sprintf("agent: invalid action name %q", action))
	case h == nil:
		panic(fmt.Sprintf("agent: nil handler for %q", action))
	case a.handlers[action] != nil:
		panic(fmt.Sprintf("agent: action %q registered twice", action))
	}
	a.handlers[action] = h
}

// Ready is closed once the agent consumes tasks and has announced itself.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// TaskSubject is the subject tasks for this agent are published on.
func (a *Agent) TaskSubject() string {
	return protocol.TaskSubject(protocol.Shard(a.cfg.Pool, a.cfg.ID, a.cfg.TaskShards), a.cfg.Pool, a.cfg.ID)
}

// resolveActions decides which actions run, from the configuration's
// allow-list and the registered handlers. The allow-list wins: an action not
// allowed is never run, and an allowed action without a handler is an error.
func (a *Agent) resolveActions() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started = true
	all := map[string]HandlerFunc{}
	for name, f := range actions.Builtins(actions.Config{Shell: a.cfg.Shell, HTTP: a.cfg.HTTP}) {
		all[name] = adapt(f)
	}
	for name, h := range a.handlers {
		all[name] = h
	}
	allow := a.cfg.Actions
	if len(allow) == 0 {
		allow = []string{actions.NameEcho, actions.NameSleep}
		for name := range a.handlers {
			allow = append(allow, name)
		}
	}
	a.allowed = map[string]HandlerFunc{}
	var missing []string
	for _, name := range allow {
		h, ok := all[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		a.allowed[name] = h
	}
	if len(missing) > 0 {
		return fmt.Errorf("actions lists %q but no handler is registered for it (built-ins: %s)",
			missing, strings.Join(actions.BuiltinNames(), ", "))
	}
	for name := range a.handlers {
		if a.allowed[name] == nil {
			a.log.Warn().Str("action", name).Msg("handler registered but not in the actions allow-list: it will not run")
		}
	}
	a.allowedNames = make([]string, 0, len(a.allowed))
	for name := range a.allowed {
		a.allowedNames = append(a.allowedNames, name)
	}
	sort.Strings(a.allowedNames)
	return nil
}

// adapt turns a built-in action into a handler.
func adapt(f actions.Func) HandlerFunc {
	return func(ctx context.Context, t *Task) (any, error) { return f(ctx, t.Params) }
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

// errorsIsAny reports whether err matches any of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

var pid = os.Getpid()
