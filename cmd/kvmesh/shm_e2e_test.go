package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestServeShmSocketShared: kvmesh serve gives its shared-memory socket the
// group and mode asked for (its directory: search permission for the
// group only), and inspect members says the node serves shared memory,
// reachable from here; a node with --shm-socket off says off.
func TestServeShmSocketShared(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	gid := os.Getgid()
	if os.Getuid() == 0 {
		gid = 4321 // root may give it any group
	} else if gs, _ := os.Getgroups(); len(gs) > 0 {
		gid = gs[len(gs)-1]
	}
	sockDir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "shm.sock")
	d := startDaemon(t, t.TempDir(), "--shm-socket", sock, "--shm-socket-mode", "0660", "--shm-socket-group", strconv.Itoa(gid))
	for path, want := range map[string]os.FileMode{sock: 0o660, sockDir: 0o710} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want || int(fi.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Errorf("%s: mode %v group %d; want %v and %d", path, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid, want, gid)
		}
	}
	off := startDaemon(t, t.TempDir(), "--shm-socket", "off")

	for _, tc := range []struct {
		d    *daemon
		shm  bool
		text string
	}{{d, true, "on, here: " + sock}, {off, false, "off"}} {
		out, err := exec.Command(binary(t), "inspect", "--addr", tc.d.grpcAddr, "members", "-o", "json").CombinedOutput()
		var members []memberJSON
		if err != nil || json.Unmarshal(out, &members) != nil || len(members) != 1 {
			t.Fatalf("inspect members -o json: %v\n%s", err, out)
		}
		if m := members[0]; m.Shm != tc.shm || m.ShmHere != tc.shm {
			t.Errorf("inspect members -o json: shm %v, shm_this_host %v; want %v", m.Shm, m.ShmHere, tc.shm)
		}
		out, err = exec.Command(binary(t), "inspect", "--addr", tc.d.grpcAddr, "members").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SHM") || !strings.Contains(string(out), tc.text) {
			t.Errorf("inspect members: want SHM %q:\n%s", tc.text, out)
		}
	}
}
