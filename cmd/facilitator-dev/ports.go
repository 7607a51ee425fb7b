package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A port the stack needs that something else holds must stop it before anything starts: anvil
// on a taken port exits, and its readiness check then finds the other process's node and deploys
// USDC onto it (ending in a confusing address mismatch); the facilitator would fail to listen
// only after the chain was set up.

// checkPortFree binds addr and lets it go; taken, it names the port, what holds it when this
// machine says (Linux: /proc), and the flag that moves it.
func checkPortFree(what, addr, flag string) error {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln.Close()
	}
	holder := ""
	if _, p, splitErr := net.SplitHostPort(addr); splitErr == nil {
		if port, convErr := strconv.Atoi(p); convErr == nil && port > 0 {
			if h := portHolder(port); h != "" {
				holder = " (held by " + h + ")"
			}
		}
	}
	return fmt.Errorf("%s's address %s is taken%s: stop what holds it, or pass %s with another port (0: a free one): %w", what, addr, holder, flag, err)
}

// portHolder names the process listening on TCP port, "pid N (name)", or "" when it cannot be
// told (another user's process, or no /proc).
func portHolder(port int) string {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, ino := range listeningInodes(f, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range pids {
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				return holderName(dir)
			}
		}
	}
	return "another user's process"
}

// listeningInodes reads a /proc/net/tcp table: the socket inodes listening on port.
func listeningInodes(table string, port int) []string {
	f, err := os.Open(table)
	if err != nil {
		return nil
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
			continue
		}
		out = append(out, fields[9])
	}
	return out
}

// holderName is "pid N (program)": the program's name alone, since a command line may carry a
// password (a database URL).
func holderName(dir string) string {
	pid := filepath.Base(dir)
	raw, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
	name := filepath.Base(strings.SplitN(string(raw), "\x00", 2)[0])
	if name == "." || name == "" {
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		name = strings.TrimSpace(string(comm))
	}
	return "pid " + pid + " (" + name + ")"
}
