package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestInspectGroups: a hybrid prompt put into a kvmesh serve process whose
// newest state is missing; inspect lookup with --groups says the hit is one
// block short and that the state group is why, inspect block describes a
// state record.
func TestInspectGroups(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--dram", "128MiB")
	c := dialNode(t, d)
	ctx := context.Background()
	groupsJSON := `[{"kind":"full","layers":[3],"kv_heads":1,"head_dim":8},` +
		`{"kind":"sliding","window":32,"layers":[0,1,2],"kv_heads":1,"head_dim":8},` +
		`{"kind":"state","layers":[4],"dtype":"float32","kv_heads":2,"state_bytes":16}]`
	gs, err := prefixhash.ParseGroupsJSON([]byte(groupsJSON), prefixhash.Float16)
	if err != nil {
		t.Fatal(err)
	}
	ns := prefixhash.Namespace{Model: "e2e/hybrid", DType: prefixhash.Float16, BlockTokens: 16, Layers: 5, Groups: gs}
	const n = 4
	tokens := make([]uint32, n*16)
	for i := range tokens {
		tokens[i] = uint32(7 + 13*i)
	}
	for g := range gs.Len() {
		payloads := make([][]byte, n)
		if g == 2 {
			payloads = payloads[:n-1]
		}
		for i := range payloads {
			payloads[i] = make([]byte, ns.GroupBytes(g))
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens, Group: g}, payloads); err != nil {
			t.Fatalf("group %d: %v", g, err)
		}
	}
	toks := make([]string, len(tokens))
	for i, tk := range tokens {
		toks[i] = fmt.Sprint(tk)
	}
	args := []string{"inspect", "--addr", d.grpcAddr, "lookup", "--tokens", strings.Join(toks, ","), "--model", ns.Model,
		"--dtype", "float16", "--block-tokens", "16", "--layers", "5", "--groups", groupsJSON}
	out, err := exec.Command(binary(t), append(args, "-o", "json")...).CombinedOutput()
	if err != nil {
		t.Fatalf("inspect lookup: %v\n%s", err, out)
	}
	var l lookupJSON
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []lookupGroupJSON{{0, "full", n}, {1, "sliding", n}, {2, "state", n - 1}}
	if l.CachedBlocks != n-1 || fmt.Sprint(l.Groups) != fmt.Sprint(want) {
		t.Fatalf("inspect lookup -o json: %d blocks, groups %+v; want %d, %+v", l.CachedBlocks, l.Groups, n-1, want)
	}
	out, err = exec.Command(binary(t), args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "group 2") || !strings.Contains(string(out), fmt.Sprintf("state: %d blocks", n-1)) {
		t.Fatalf("inspect lookup:\n%s", out)
	}

	key := prefixhash.GroupKey(prefixhash.Keys(ns, tokens)[1], 2)
	out, err = exec.Command(binary(t), "inspect", "--addr", d.grpcAddr, "block", key.String(), "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("inspect block: %v\n%s", err, out)
	}
	var b blockJSON
	if err := json.Unmarshal(out, &b); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if b.Group == nil || *b.Group != 2 || b.GroupKind != "state" || b.KVLayout != "state" || b.StateBytes != 16 ||
		b.ChainKey != prefixhash.Keys(ns, tokens)[1].String() {
		t.Fatalf("inspect block -o json: %s", out)
	}
	out, err = exec.Command(binary(t), "inspect", "--addr", d.grpcAddr, "block", key.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 (state)") {
		t.Fatalf("inspect block:\n%s", out)
	}
}
