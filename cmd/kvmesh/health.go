package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
)

// healthCmd asks a node's gRPC health service whether it serves: the
// check of a container's HEALTHCHECK or a probe, where the image has no
// shell or curl. Health checking needs no token.
func healthCmd() *cobra.Command {
	var (
		addr, service string
		timeout       time.Duration
		sec           securityFlags
	)
	c := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if the node at --addr reports SERVING through gRPC health checking, else 1",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envLayer(cmd); err != nil {
				return err
			}
			if err := checkHostPort("--addr", addr); err != nil {
				return err
			}
			creds := insecure.NewCredentials()
			if sec.enabled() {
				var o client.Options
				if err := sec.apply(&o); err != nil {
					return err
				}
				creds = credentials.NewTLS(o.TLS)
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				return fmt.Errorf("--addr %q: %w", addr, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			if err != nil {
				return fmt.Errorf("health of %s: %w", addr, err)
			}
			if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("%s: %s", addr, st)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "SERVING")
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&addr, "addr", node.DefaultGRPCAddr, "gRPC address HOST:PORT of the node")
	fs.StringVar(&service, "service", "", `service to ask about ("": the node as a whole; kvmesh.v1.CacheService, kvmesh.v1.AdminService)`)
	fs.DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	sec.register(fs)
	return c
}
