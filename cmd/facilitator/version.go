package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// runVersion is `facilitator version`: the module version and the VCS revision the binary was
// built from, as the Go toolchain recorded them, so an operator can tell which release a replica
// runs without trusting an image tag.
func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArguments(fs); err != nil {
		return err
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return errors.New("version: this binary carries no build information")
	}
	_, err := io.WriteString(stdout, versionText(info))
	return err
}

// buildLabels are the labels of facilitator_build_info: the module version ("(devel)" for a
// build from a checkout), the VCS revision ("unknown" without VCS information; "-modified" added
// when the tree had uncommitted changes) and the Go version.
func buildLabels(info *debug.BuildInfo) (version, revision, goVersion string) {
	version, revision = info.Main.Version, "unknown"
	if version == "" {
		version = "(devel)"
	}
	var modified bool
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			revision = kv.Value
		case "vcs.modified":
			modified = kv.Value == "true"
		}
	}
	if modified && revision != "unknown" {
		revision += "-modified"
	}
	return version, revision, info.GoVersion
}

// versionText is the build's description: "facilitator <version>" and, where the toolchain
// stamped them (a build from a checkout, not `go run` or a test), the revision, its time and
// whether the tree had uncommitted changes, then the Go version.
func versionText(info *debug.BuildInfo) string {
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	s := fmt.Sprintf("facilitator %s\n", version)
	settings := map[string]string{}
	for _, kv := range info.Settings {
		settings[kv.Key] = kv.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		s += "revision " + rev
		if settings["vcs.modified"] == "true" {
			s += " (modified)"
		}
		s += "\n"
		if t := settings["vcs.time"]; t != "" {
			s += "committed " + t + "\n"
		}
	} else {
		s += "revision unknown (built without VCS information)\n"
	}
	return s + info.GoVersion + "\n"
}
