package stacktest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser is a headless Chromium of the test's own, driven with chromedp, closed when the test
// ends; a missing chromium (scripts/chromium.sh installs Debian's) fails the test under CI=true
// and skips it elsewhere. Every action on the returned context is bounded by three minutes, the browser included.
func Browser(t testing.TB) context.Context {
	t.Helper()
	path := os.Getenv("CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		missing(t, "this test needs a headless Chromium (run scripts/chromium.sh, or set CHROMIUM)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path),
		// Root in a container has no user namespace for Chromium's sandbox.
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		missing(t, "chromium %s does not start: %v", path, err)
	}
	return ctx
}

// ArtifactDir is where tests leave what a person looks at afterwards (screenshots): the
// TEST_ARTIFACTS directory when set, else one under the system's temporary directory.
func ArtifactDir(t testing.TB, name string) string {
	t.Helper()
	root := os.Getenv("TEST_ARTIFACTS")
	if root == "" {
		root = filepath.Join(os.TempDir(), "x402-test-artifacts")
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WaitPage waits until the expression is true on the browser's page, across navigations: a
// page being replaced answers "no such context" for a moment, which is not the expression's
// answer, so it is asked again. It fails the test after timeout, with the page's URL and text.
func WaitPage(t testing.TB, b context.Context, expression string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(b, chromedp.Evaluate[bool](expression))
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	page, _ := chromedp.Run(b, chromedp.Evaluate[string](`location.href + " " + document.body.innerText`))
	t.Fatalf("the page never had %s (last error %v): %s", expression, last, page)
}
