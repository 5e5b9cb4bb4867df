//go:build !linux

package bench

import "syscall"

func setDeathSignal(*syscall.SysProcAttr) {}

// checkDirectIO leaves the verdict to fio where O_DIRECT is not Linux's.
func checkDirectIO(string) error { return nil }
