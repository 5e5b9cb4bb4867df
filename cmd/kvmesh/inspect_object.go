package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// objectNamespace is the namespace of objects when no namespace flag is
// given: the one kvmesh.mooncake.MooncakeDistributedStore (Python) stores
// its objects in by default.
var objectNamespace = prefixhash.Namespace{Model: "mooncake", DType: prefixhash.Int8, BlockTokens: 1, Layers: 1, KVHeads: 1, HeadDim: 1}

// objectNS is the namespace of the object commands: the flags' when one is
// given, else objectNamespace.
func objectNS(cmd *cobra.Command, nf *namespaceFlags) (prefixhash.Namespace, error) {
	if namespaceGiven(cmd) {
		return nf.namespace()
	}
	return objectNamespace, nil
}

type objectJSON struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	Found     bool   `json:"found"`
	Node      string `json:"node,omitempty"`
	Tier      string `json:"tier,omitempty"`
	Size      uint64 `json:"size"`
	Pieces    int    `json:"pieces"`
	Pin       string `json:"pin,omitempty"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

func objectCmd(f *inspectFlags) *cobra.Command {
	var nf namespaceFlags
	c := &cobra.Command{
		Use:   "object NAME...",
		Short: "Objects by name on the node: size, pieces, tier, retention",
		Long: `Objects by name on the node at --addr: whether it holds each one's first
piece, and then its size, how many pieces it has, the tier and the retention
(pin, TTL left). With no namespace flag the namespace is the one the Python
kvmesh.mooncake.MooncakeDistributedStore uses by default (--model mooncake
--dtype int8 --block-tokens 1 --layers 1 --kv-heads 1 --head-dim 1).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			if err := envLayer(cmd); err != nil {
				return err
			}
			ns, err := objectNS(cmd, &nf)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := prefixhash.CheckObjectName(n); err != nil {
					return err
				}
			}
			out := []objectJSON{}
			err = f.withNode(cmd, func(ctx context.Context, c *client.Client) error {
				sns, err := c.Namespace(ctx, ns)
				if err != nil {
					return err
				}
				for _, name := range names {
					key := prefixhash.ObjectKey(sns.Root(), name)
					o := objectJSON{Name: name, Key: key.String()}
					b, err := c.BlockInfo(ctx, key)
					switch {
					case errors.Is(err, client.ErrNotFound):
					case err != nil:
						return err
					case b.Object != nil:
						o.Found, o.Node, o.Tier, o.Size, o.Pieces = true, b.NodeID, b.Tier, b.Object.Size, b.Object.Pieces
						if b.Retention != (block.Retention{}) {
							o.Pin, o.TTLMillis = b.Retention.Pin.String(), b.Retention.TTL.Milliseconds()
						}
					}
					out = append(out, o)
				}
				return nil
			})
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tFOUND\tSIZE\tPIECES\tTIER\tPIN\tTTL")
				for _, o := range out {
					if !o.Found {
						fmt.Fprintf(w, "%s\tno\t-\t-\t-\t-\t-\n", o.Name)
						continue
					}
					ttl := "-"
					if o.TTLMillis > 0 {
						ttl = (time.Duration(o.TTLMillis) * time.Millisecond).String()
					}
					fmt.Fprintf(w, "%s\tyes\t%s\t%d\t%s\t%s\t%s\n", o.Name, formatSize(int64(o.Size)), o.Pieces, o.Tier, dash(o.Pin), ttl)
				}
			})
		},
	}
	nf.register(c)
	return c
}

type retainJSON struct {
	Objects map[string]bool `json:"objects,omitempty"`
	Blocks  int             `json:"prefix_blocks"`
	Applied int             `json:"prefix_blocks_applied"`
}

func retainCmd(f *inspectFlags) *cobra.Command {
	var nf namespaceFlags
	var objects []string
	var text, tokens, pin string
	var ttl time.Duration
	c := &cobra.Command{
		Use:   "retain [--object NAME]... [--text T | --tokens 1,2,3] [--pin none|soft|hard] [--ttl D]",
		Short: "Pin objects or a prompt's prefix, give them a lease, or clear it",
		Long: `Set the retention of objects (by name, every piece) and of the blocks of a
prompt's prefix, on the nodes that own them, replacing what they had:

  --pin hard            never evicted (counted against the namespace's quota
                        and the node's share of pinned bytes)
  --pin soft            evicted only when nothing unpinned is left
  --ttl 10m             with no pin: a lease, not evicted before it lapses;
                        with a pin: the pin lapses then
  --pin none --ttl 0    clears it

A prompt's prefix is pinned from its first block: pin the whole prefix that
requests share. Objects take the object namespace (see 'inspect object');
a prompt with no namespace flag, the node's prefill engine's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envLayer(cmd); err != nil {
				return err
			}
			p, err := block.ParsePin(pin)
			if err != nil {
				return fmt.Errorf("--pin: %w", err)
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %v: want a duration of 0 or more", ttl)
			}
			var toks []uint32
			if text != "" || tokens != "" {
				if toks, err = promptTokens(cmd, text, tokens); err != nil {
					return err
				}
			}
			if len(objects) == 0 && len(toks) == 0 {
				return errors.New("name what to retain: --object NAME (repeatable) and/or a prompt (--text or --tokens)")
			}
			r := block.Retention{Pin: p, TTL: ttl}
			out := retainJSON{}
			err = f.withNode(cmd, func(ctx context.Context, c *client.Client) error {
				if len(objects) > 0 {
					ns, err := objectNS(cmd, &nf)
					if err != nil {
						return err
					}
					applied, err := c.Retain(ctx, ns, client.Prompt{Names: objects}, r)
					if err != nil {
						return err
					}
					out.Objects = map[string]bool{}
					for i, name := range objects {
						out.Objects[name] = applied[i]
					}
				}
				if len(toks) > 0 {
					ns, err := lookupNamespace(ctx, c, namespaceGiven(cmd), &nf)
					if err != nil {
						return err
					}
					applied, err := c.Retain(ctx, ns, client.Prompt{Tokens: toks}, r)
					if err != nil {
						return err
					}
					out.Blocks = len(applied)
					for _, a := range applied {
						if !a {
							break
						}
						out.Applied++
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				for _, name := range objects {
					fmt.Fprintf(w, "object %s\t%s\n", name, map[bool]string{true: "retained", false: "not held"}[out.Objects[name]])
				}
				if len(toks) > 0 {
					fmt.Fprintf(w, "prefix\t%d of %d blocks retained (the cached prefix)\n", out.Applied, out.Blocks)
				}
			})
		},
	}
	fs := c.Flags()
	fs.StringArrayVar(&objects, "object", nil, "an object's name (repeatable)")
	fs.StringVar(&text, "text", "", "a prompt as text, one token per UTF-8 byte")
	fs.StringVar(&tokens, "tokens", "", "a prompt as token ids: 1,2,3")
	fs.StringVar(&pin, "pin", "none", "none, soft or hard")
	fs.DurationVar(&ttl, "ttl", 0, "a lease (no pin) or the pin's lifetime; 0: none")
	nf.register(c)
	return c
}
