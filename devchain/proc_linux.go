package devchain

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts anvil in its own process group so Close can kill it as a
// whole, and asks the kernel to kill it if the test binary dies without Close
// (panic, go test -timeout), so no anvil is left holding a port.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
}
