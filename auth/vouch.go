package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A node that acts for a caller toward a peer (asking it for a batch the
// caller queued there, say) never passes the caller's bearer token on: it
// calls with the cluster credential and vouches for the caller, in a value
// the peer checks (Vouched). The value names the caller's tenant and
// scopes, the one request it is for (method and path) and an expiry, and
// is signed with a key derived from the tokens file's secret, which every
// node holds and no tenant does. A peer so learns whom to act for from the
// cluster, not from whoever holds the cluster token alone, and a value
// cannot be replayed for another request or after a minute.

// VouchTTL is how long a vouch is good for.
const VouchTTL = time.Minute

// ErrVouch is why Vouched refused a value.
var ErrVouch = errors.New("auth: vouch refused")

type vouchClaim struct {
	Tenant string `json:"t,omitempty"`
	Scopes Scope  `json:"s"`
	What   string `json:"w"`
	Exp    int64  `json:"e"` // unix seconds
}

// Vouch returns the value that vouches for p making the request what
// (method and path), valid until now+VouchTTL. The cluster scope is never
// vouched for.
func (f *File) Vouch(p Principal, what string, now time.Time) string {
	c := vouchClaim{Tenant: p.Tenant, Scopes: p.Scopes &^ Cluster, What: what, Exp: now.Add(VouchTTL).Unix()}
	b, _ := json.Marshal(c) // a struct of strings and ints
	claim := base64.RawURLEncoding.EncodeToString(b)
	return claim + "." + base64.RawURLEncoding.EncodeToString(f.vouchMAC(claim))
}

func (f *File) vouchMAC(claim string) []byte {
	m := hmac.New(sha256.New, f.peerKey)
	m.Write([]byte("kvmesh/vouch/v1\x00" + claim))
	return m.Sum(nil)
}

// Vouched checks a value Vouch made for the request what and returns the
// principal it vouches for: a tenant of this file (its salt and tag as
// the file derives them) or a node-wide principal, with the scopes vouched
// for. An error wraps ErrVouch: a bad signature, another request, an
// expired value, or a tenant this file does not know.
func (f *File) Vouched(v, what string, now time.Time) (Principal, error) {
	claim, mac, ok := strings.Cut(v, ".")
	sig, err := base64.RawURLEncoding.DecodeString(mac)
	if !ok || err != nil || !hmac.Equal(sig, f.vouchMAC(claim)) {
		return Principal{}, fmt.Errorf("%w: not signed by a node of this cluster", ErrVouch)
	}
	b, err := base64.RawURLEncoding.DecodeString(claim)
	var c vouchClaim
	if err != nil || json.Unmarshal(b, &c) != nil {
		return Principal{}, fmt.Errorf("%w: malformed", ErrVouch)
	}
	switch {
	case c.What != what:
		return Principal{}, fmt.Errorf("%w: made for another request", ErrVouch)
	case now.Unix() > c.Exp:
		return Principal{}, fmt.Errorf("%w: expired", ErrVouch)
	}
	if c.Tenant == "" {
		return Principal{Scopes: c.Scopes &^ Cluster}, nil
	}
	for _, cr := range f.Credentials {
		if cr.Principal.Tenant == c.Tenant {
			p := cr.Principal
			p.Scopes = c.Scopes &^ Cluster
			return p, nil
		}
	}
	return Principal{}, fmt.Errorf("%w: tenant %q is not in this node's tokens file", ErrVouch, c.Tenant)
}
