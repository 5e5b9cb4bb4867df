package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setDeathSignal makes the kernel stop a peer server the bench started if
// the bench dies without stopping it.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// checkDirectIO reports, wrapping ErrMissing, when the file system of dir
// refuses O_DIRECT (tmpfs does), which fio's direct jobs need.
func checkDirectIO(dir string) error {
	f, err := os.CreateTemp(dir, "kvmesh-bench-direct-")
	if err != nil {
		return fmt.Errorf("bench: fio: %w", err)
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := unix.Open(name, unix.O_RDWR|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: fio: the file system of %s does not support direct I/O", ErrMissing, filepath.Clean(dir))
	}
	if err != nil {
		return fmt.Errorf("bench: fio: probe direct I/O: %w", err)
	}
	return unix.Close(fd)
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pidCPU returns the CPU time (user and system) process pid has used, from
// /proc/PID/stat, or 0 when pid is 0 or unreadable.
func pidCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after its closing parenthesis (state is field 3, utime 14, stime 15).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	const clockTicks = 100 // USER_HZ: 100 on every Linux ABI Go supports
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// loadAverage returns the machine's one-minute load average.
func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("bench: empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}
