package main

import (
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"

	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/transfer"
)

// securityFlags are how a command that talks to a node as a client reaches
// one that asks for TLS or a bearer token. Every client command registers
// them (inspect; prefill and bench too): --tls, --tls-ca, --tls-cert,
// --tls-key, --tls-server-name, --auth-token-file, each also a KVMESH_*
// variable.
type securityFlags struct {
	tls                   bool
	ca, cert, key, server string
	tokenFile             string
}

func (f *securityFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.tls, "tls", false, "speak TLS to the node, verified against the system's roots unless --tls-ca is given (implied by the other --tls-* flags)")
	fs.StringVar(&f.ca, "tls-ca", "", "PEM file of the CA that signs the node's certificate")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM file of a client certificate, for a node that asks for one (mutual TLS)")
	fs.StringVar(&f.key, "tls-key", "", "PEM file of the client certificate's key")
	fs.StringVar(&f.server, "tls-server-name", "", "name to verify in the node's certificate (default: the host of --addr)")
	fs.StringVar(&f.tokenFile, "auth-token-file", "", "file whose first line is the bearer token to present to the node")
}

// enabled reports whether TLS is asked for.
func (f *securityFlags) enabled() bool {
	return f.tls || f.ca != "" || f.cert != "" || f.key != "" || f.server != ""
}

// apply sets o.TLS and o.Token from the flags.
func (f *securityFlags) apply(o *client.Options) error {
	if f.enabled() {
		if (f.cert == "") != (f.key == "") {
			return errors.New("--tls-cert and --tls-key go together: a client certificate and its key")
		}
		_, cfg, err := transfer.LoadTLS(transfer.TLSFiles{Cert: f.cert, Key: f.key, CA: f.ca, ServerName: f.server})
		if err != nil {
			return fmt.Errorf("TLS flags: %w", err)
		}
		o.TLS = cfg
	}
	if f.tokenFile != "" {
		tokens, err := auth.ReadTokenList(f.tokenFile)
		if err != nil {
			return fmt.Errorf("--auth-token-file: %w", err)
		}
		o.Token = tokens[0]
	}
	return nil
}
