package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersion: `facilitator version` prints the module version and the revision the toolchain
// stamped, and says so when there is none (go test and go run stamp none).
func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"version"}, func(string) string { return "" }, &out, &errOut); code != 0 {
		t.Fatalf("version exited %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "facilitator ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("version printed %q", out.String())
	}
	got := versionText(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "04aeb06"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}})
	if want := "facilitator v1.2.3\nrevision 04aeb06 (modified)\ncommitted 2026-01-02T03:04:05Z\ngo1.26.0\n"; got != want {
		t.Errorf("versionText:\n%s\nwant\n%s", got, want)
	}
	if got := versionText(&debug.BuildInfo{GoVersion: "go1.26.0"}); !strings.Contains(got, "(devel)") || !strings.Contains(got, "revision unknown") {
		t.Errorf("versionText without stamps: %q", got)
	}
}

// TestBuildLabels: facilitator_build_info's labels are what `facilitator version` prints, in
// label form.
func TestBuildLabels(t *testing.T) {
	for _, tc := range []struct {
		info                   debug.BuildInfo
		version, revision, goV string
	}{
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "04aeb06"}, {Key: "vcs.modified", Value: "false"}}}, "v1.2.3", "04aeb06", "go1.26.0"},
		{debug.BuildInfo{GoVersion: "go1.26.0", Settings: []debug.BuildSetting{
			{Key: "vcs.modified", Value: "true"}, {Key: "vcs.revision", Value: "04aeb06"}}}, "(devel)", "04aeb06-modified", "go1.26.0"},
		{debug.BuildInfo{GoVersion: "go1.26.0"}, "(devel)", "unknown", "go1.26.0"},
	} {
		v, r, g := buildLabels(&tc.info)
		if v != tc.version || r != tc.revision || g != tc.goV {
			t.Errorf("buildLabels(%+v) = %q %q %q, want %q %q %q", tc.info, v, r, g, tc.version, tc.revision, tc.goV)
		}
	}
}

// TestHealthcheck: `facilitator healthcheck` exits 0 when /healthz answers 200 and 1 otherwise,
// and by default asks the loopback at FACILITATOR_LISTEN's port.
func TestHealthcheck(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	check := func(args ...string) int {
		_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
		env := map[string]string{"FACILITATOR_LISTEN": "0.0.0.0:" + port}
		var out, errOut bytes.Buffer
		return run(context.Background(), append([]string{"healthcheck"}, args...), func(k string) string { return env[k] }, &out, &errOut)
	}
	if code := check(); code != 0 {
		t.Fatalf("healthy, by FACILITATOR_LISTEN's port: exit %d", code)
	}
	if code := check("--url", srv.URL+"/healthz"); code != 0 {
		t.Fatalf("healthy, by --url: exit %d", code)
	}
	status = http.StatusServiceUnavailable
	if code := check(); code != 1 {
		t.Fatalf("answering 503: exit %d, want 1", code)
	}
	if code := check("--url", "http://127.0.0.1:1/healthz"); code != 1 {
		t.Fatalf("nothing listening: exit %d, want 1", code)
	}
}
