//go:build !linux

package devchain

import "os/exec"

// The anvil npm binary is linux-amd64 only; elsewhere this just has to compile.
func setProcessGroup(*exec.Cmd) {}

func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
