package prefixhash

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestObjectVectors checks ObjectKey and PieceKey against testdata/objects.json,
// which an independent script computed with hashlib.
func TestObjectVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/objects.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Vectors []struct {
			Root      string   `json:"root"`
			Name      string   `json:"name"`
			ObjectKey string   `json:"object_key"`
			PieceKeys []string `json:"piece_keys"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) < 10 {
		t.Fatalf("%d vectors", len(f.Vectors))
	}
	for _, v := range f.Vectors {
		root, err := ParseKey(v.Root)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckObjectName(v.Name); err != nil {
			t.Fatalf("vector name %q: %v", v.Name, err)
		}
		o := ObjectKey(root, v.Name)
		if o.String() != v.ObjectKey {
			t.Errorf("ObjectKey(%s, %.20q) = %s, want %s", v.Root, v.Name, o, v.ObjectKey)
		}
		for j, want := range v.PieceKeys {
			if got := PieceKey(o, j); got.String() != want {
				t.Errorf("PieceKey(%s, %d) = %s, want %s", o, j, got, want)
			}
		}
	}
}

func TestObjectNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"k", true},
		{strings.Repeat("x", MaxObjectName), true},
		{"", false},
		{strings.Repeat("x", MaxObjectName+1), false},
		{"bad\xff", false},
		{"tab\tand\x00nul", true},
	} {
		err := CheckObjectName(tc.name)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrObjectName)) {
			t.Errorf("CheckObjectName(%.20q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	// Objects of two namespaces never share a key.
	a := Namespace{Model: "m", DType: Float16, BlockTokens: 16, Layers: 2, KVHeads: 2, HeadDim: 8}
	b := a
	b.TenantSalt = "other"
	if ObjectKey(a.Root(), "k") == ObjectKey(b.Root(), "k") {
		t.Fatal("two namespaces share an object key")
	}
}
