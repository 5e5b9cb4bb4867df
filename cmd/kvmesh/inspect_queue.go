package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/openai"
)

// queueCmd is inspect queue: GET /v1/queue on a node's (or a router's)
// HTTP address, as the token's tenant.
func queueCmd(f *inspectFlags) *cobra.Command {
	var httpAddr string
	c := &cobra.Command{
		Use:   "queue",
		Short: "The caller's queued batches (POST /v1/queue) on the node or router at --http-addr",
		Long: `The batches of the token's tenant (--auth-token-file) on the node at --http-addr,
or on every node behind a kvmesh route address: those not finished first, in the
order they run, then the most recently finished. It asks the HTTP API
(GET /v1/queue), not the gRPC address.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envLayer(cmd); err != nil {
				return err
			}
			if f.output != "table" && f.output != "json" {
				return fmt.Errorf("-o %q: want table or json", f.output)
			}
			var opts client.Options
			if err := f.sec.apply(&opts); err != nil {
				return err
			}
			scheme, hc := "http://", &http.Client{Timeout: f.timeout}
			if opts.TLS != nil {
				scheme, hc.Transport = "https://", &http.Transport{TLSClientConfig: opts.TLS}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+httpAddr+openai.QueuePath, nil)
			if err != nil {
				return err
			}
			if opts.Token != "" {
				req.Header.Set("Authorization", "Bearer "+opts.Token)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("GET %s on %s: %w", openai.QueuePath, httpAddr, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			if err != nil {
				return fmt.Errorf("GET %s on %s: %w", openai.QueuePath, httpAddr, err)
			}
			if resp.StatusCode != http.StatusOK {
				var e struct{ Error struct{ Message string } }
				json.Unmarshal(body, &e)
				return fmt.Errorf("GET %s on %s: %s: %s", openai.QueuePath, httpAddr, resp.Status, e.Error.Message)
			}
			var list openai.QueueList
			if err := json.Unmarshal(body, &list); err != nil {
				return fmt.Errorf("GET %s on %s: the answer is not a list: %w", openai.QueuePath, httpAddr, err)
			}
			return f.print(cmd.OutOrStdout(), list.Data, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "REQUEST ID\tSTATUS\tANSWERED\tFAILED\tRUNS\tCREATED\tFINISHED")
				at := func(s int64) string {
					if s == 0 {
						return "-"
					}
					return time.Unix(s, 0).UTC().Format(time.RFC3339)
				}
				for _, b := range list.Data {
					fmt.Fprintf(w, "%s\t%s\t%d/%d\t%d\t%d\t%s\t%s\n", b.RequestID, b.Status, b.Answered, b.Requests, b.Failed, b.Runs, at(b.Created), at(b.Finished))
				}
				fmt.Fprintf(w, "\n%d batches\n", len(list.Data))
			})
		},
	}
	c.Flags().StringVar(&httpAddr, "http-addr", node.DefaultHTTPAddr, "HTTP address HOST:PORT of the node (or of kvmesh route)")
	return c
}
