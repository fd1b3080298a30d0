package operate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium finds a headless-capable Chromium (Debian's chromium package).
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// dashboard drives the dashboard in headless Chromium: the job appears,
// its retry chain opens, the dead letter is retried from the UI and the
// step succeeds. Screenshots go to the test's artifact directory (kept with
// go test -artifacts).
func dashboard(t *testing.T, e *env, jobID string) {
	bin := chromium()
	if bin == "" {
		t.Skip("no Chromium found (apt-get install chromium): the dashboard's browser test is skipped")
	}
	out := t.ArtifactDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless,
		chromedp.WindowSize(1400, 900), chromedp.Flag("force-dark-mode", os.Getenv("WARDEN_DARK") != ""))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The browser starts with the first Do, on a context without a
	// deadline (a deadline would stop the browser); each phase has its own.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			b, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, name), b, 0o644)
		})
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 45*time.Second)
		defer cancel()
		if err := chromedp.Do(pctx, actions...); err != nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_ = chromedp.Do(sctx, shot("failed.png"))
			t.Fatalf("%s: %v (screenshot failed.png in %s)", what, err, out)
		}
	}
	// click clicks sel until want shows: a live update may re-render the
	// view between finding the node and clicking it.
	click := func(sel, want string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(c context.Context, tg *chromedp.Target) error {
			for {
				if _, err := chromedp.WaitVisible(chromedp.CSS(sel))(c, tg); err != nil {
					return err
				}
				_, _ = chromedp.Click(chromedp.CSS(sel))(c, tg)
				wctx, cancel := context.WithTimeout(c, 3*time.Second)
				_, err := chromedp.WaitVisible(chromedp.CSS(want))(wctx, tg)
				cancel()
				if err == nil || c.Err() != nil {
					return c.Err()
				}
			}
		})
	}
	run("overview",
		chromedp.Navigate(e.api+"/#/overview"),
		chromedp.WaitVisible(chromedp.CSS(`#ov-dlq`)),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)),
		shot("0-overview.png"))
	run("the job appears in the list",
		chromedp.Navigate(e.api+"/#/jobs"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-job="`+jobID+`"]`)),
		shot("1-jobs.png"))
	run("its retry chain opens",
		click(`tr[data-job="`+jobID+`"]`, `tr[data-step="f"]`),
		chromedp.WaitReady(chromedp.CSS(`svg g.node[data-step="f"]`)),
		click(`tr[data-step="f"]`, `#retry-chain .attempt[data-attempt="2"]`),
		shot("2-retry-chain.png"))
	run("agents",
		chromedp.Navigate(e.api+"/#/agents"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-agent="default.p1"]`)),
		shot("3-agents.png"))
	run("history",
		chromedp.Navigate(e.api+"/#/history"),
		chromedp.WaitVisible(chromedp.CSS(`main[data-view="history"] table`)),
		shot("4-history.png"))
	run("the dead letter is listed",
		chromedp.Navigate(e.api+"/#/dlq"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-letter] button.retry`)),
		shot("5-dead-letters.png"))
	// The operator fixes the cause, then retries from the UI.
	if err := os.WriteFile(e.ledger+".fixed", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run("retry from the UI",
		click(`tr[data-letter] button.retry`, `main[data-view="dlq"] p.muted`))
	run("the step succeeds",
		chromedp.Navigate(e.api+"/#/jobs/"+jobID),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-step="s"] .s-succeeded`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-step="then"] .s-succeeded`)),
		shot("6-succeeded.png"))
	t.Logf("screenshots in %s", out)
}
