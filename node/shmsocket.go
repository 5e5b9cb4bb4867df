package node

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// shareSocket gives the shared-memory socket at path its group and mode:
// with ShmSocketGroup, the socket and its directory go to that group, the
// directory with search permission only (0710: a member reaches the socket
// by name and lists nothing), the socket with ShmSocketMode. The socket is
// created 0600 and opened to the group only once it has the group, so it
// is never open to the node user's own primary group.
func shareSocket(path string, mode os.FileMode, group string) error {
	if group != "" {
		gid, err := lookupGroup(group)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if err := os.Chown(dir, -1, gid); err != nil {
			return fmt.Errorf("node: option ShmSocketGroup: give the socket's directory %s to group %s: %w (the node's user must be a member)", dir, group, err)
		}
		if err := os.Chmod(dir, 0o710); err != nil {
			return fmt.Errorf("node: option ShmSocketGroup: %w", err)
		}
		if err := os.Chown(path, -1, gid); err != nil {
			return fmt.Errorf("node: option ShmSocketGroup: give the socket %s to group %s: %w (the node's user must be a member)", path, group, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("node: option ShmSocketMode: %w", err)
	}
	return nil
}

// lookupGroup returns the id of a group given by name or number (a number
// need not be in the group database: a container's often is not).
func lookupGroup(group string) (int, error) {
	if gid, err := strconv.ParseUint(group, 10, 31); err == nil {
		return int(gid), nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("node: option ShmSocketGroup %q: %w; give a group name or id", group, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("node: option ShmSocketGroup %q: group id %q is not a number", group, g.Gid)
	}
	return gid, nil
}
