package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRouteBadFlags: kvmesh route refuses what cannot work with one line
// naming the flag, before it binds anything.
func TestRouteBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"route"}, "--join"},
		{[]string{"route", "--join", "127.0.0.1:1", "--policy", "fastest"}, "--policy"},
		{[]string{"route", "--join", "127.0.0.1:1", "--gossip-profile", "wan"}, "lan or local"},
		{[]string{"serve", "--role", "router"}, "--role"},
		{[]string{"route", "--join", "127.0.0.1:1", "--engine-events", "127.0.0.1:5557"}, "--engine-events"},
		{[]string{"route", "--join", "127.0.0.1:1", "--weight-gpu", "2"}, "--weight-gpu"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) || strings.Count(strings.TrimSpace(errb.String()), "\n") > 0 {
			t.Errorf("kvmesh %s: exit %d, stderr %q; want 1 and one line naming %s", strings.Join(c.args, " "), code, errb.String(), c.want)
		}
	}
}
