package node

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/atomicfile"
)

// nodeIDFile is where a node keeps the id it generated on its first start.
const nodeIDFile = "node-id"

// resolveNodeID fills opts.NodeID when it is empty: from DataDir/node-id, or
// with a new id written there, so that the node keeps its id (and with it
// its share of placement) across restarts. An id given in opts is used as
// is; when it differs from the stored one, the stored one is replaced and
// the change logged: the node's NVMe blocks then belong to other owners.
func resolveNodeID(opts *Options) error {
	path := filepath.Join(opts.DataDir, nodeIDFile)
	b, err := os.ReadFile(path)
	stored := string(bytes.TrimSpace(b))
	switch {
	case err == nil && stored != "" && opts.NodeID == "":
		if len(stored) > 256 || strings.ContainsFunc(stored, unicode.IsSpace) {
			return fmt.Errorf("node: %s holds %q, not a node id; fix it or remove it", path, stored)
		}
		opts.NodeID = stored
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("node: read node id: %w", err)
	case opts.NodeID != "" && opts.NodeID == stored:
		return nil
	case opts.NodeID != "" && stored != "":
		opts.Logger.Warn("node id changed; blocks kept under the old id now belong to other owners",
			"old", stored, "new", opts.NodeID)
	case opts.NodeID == "":
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "kvmesh"
		}
		var r [4]byte
		if _, err := rand.Read(r[:]); err != nil {
			return fmt.Errorf("node: generate node id: %w", err)
		}
		opts.NodeID = strings.Map(func(c rune) rune {
			if unicode.IsSpace(c) {
				return '-'
			}
			return c
		}, host) + "-" + hex.EncodeToString(r[:])
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if err := atomicfile.Write(path, []byte(opts.NodeID+"\n"), 0o600); err != nil {
		return fmt.Errorf("node: write node id: %w", err)
	}
	return nil
}

// ReadGossipKey reads a gossip encryption key from a file holding its
// base64 encoding (standard or URL alphabet, padding optional, surrounding
// whitespace ignored): 16, 24 or 32 bytes, for AES-128, -192 or -256. Make
// one with: head -c 32 /dev/urandom | base64 > gossip.key
func ReadGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node: gossip key: %w", err)
	}
	text := strings.TrimRight(strings.TrimSpace(string(b)), "=")
	var key []byte
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		if key, err = enc.DecodeString(text); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("node: gossip key in %s is not base64: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("%w: %s holds %d bytes", gossip.ErrSecretKey, path, n)
	}
	return key, nil
}
