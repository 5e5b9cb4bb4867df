package node

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestShareSocket: with a group, the socket and its directory go to it
// (directory 0710, socket the mode asked for); without one, only the mode
// changes; a group the node's user is not in is refused with a message
// that says so; a world-accessible mode is refused by Validate.
func TestShareSocket(t *testing.T) {
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	// A group the socket may go to: any, for root; else one the user is in.
	gid := os.Getgid()
	switch {
	case os.Getuid() == 0:
		gid = 4321
	case len(groups) > 0:
		gid = groups[len(groups)-1]
	}
	listen := func(t *testing.T) (string, string) {
		dir := filepath.Join(t.TempDir(), "shm")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "shm.sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return dir, path
	}
	stat := func(t *testing.T, p string) (os.FileMode, int) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm(), int(fi.Sys().(*syscall.Stat_t).Gid)
	}

	dir, path := listen(t)
	if err := shareSocket(path, 0o660, strconv.Itoa(gid)); err != nil {
		t.Fatal(err)
	}
	if mode, g := stat(t, path); mode != 0o660 || g != gid {
		t.Errorf("socket: mode %v group %d; want 0660 and %d", mode, g, gid)
	}
	if mode, g := stat(t, dir); mode != 0o710 || g != gid {
		t.Errorf("directory: mode %v group %d; want 0710 and %d", mode, g, gid)
	}

	dir, path = listen(t)
	if err := shareSocket(path, 0o600, ""); err != nil {
		t.Fatal(err)
	}
	if mode, _ := stat(t, path); mode != 0o600 {
		t.Errorf("socket without a group: mode %v", mode)
	}
	if mode, _ := stat(t, dir); mode != 0o700 {
		t.Errorf("directory without a group: mode %v, left 0700", mode)
	}

	if os.Getuid() != 0 {
		_, path = listen(t)
		notMine := 1
		for isMember(groups, notMine) || notMine == os.Getgid() {
			notMine++
		}
		if err := shareSocket(path, 0o660, strconv.Itoa(notMine)); err == nil || !strings.Contains(err.Error(), "must be a member") {
			t.Errorf("a group the user is not in: %v", err)
		}
	}
	if err := shareSocket(path, 0o660, "no-such-group-kvmesh"); err == nil || !strings.Contains(err.Error(), "group name or id") {
		t.Errorf("an unknown group name: %v", err)
	}
	for _, mode := range []os.FileMode{0o666, 0o400, 0o4600} {
		o := Options{Listen: ListenOptions{ShmSocketMode: mode}}
		o.EnsureDefaults()
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "ShmSocketMode") {
			t.Errorf("ShmSocketMode %#o: %v", mode, err)
		}
	}
}

func isMember(groups []int, g int) bool {
	for _, x := range groups {
		if x == g {
			return true
		}
	}
	return false
}
