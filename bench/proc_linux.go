package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
