package gossiptest

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// Dilate returns a gossip.Options.Tune that multiplies every interval and
// timeout of memberlist's configuration by k, for a Network of Dilation k:
// the protocol then runs k times slower in real time with the same ratios
// between its timers and the links' latencies, so that a member starved of
// CPU for a few milliseconds on a loaded machine looks k times less late.
// Divide the times a dilated simulation measures by k (and multiply its
// rates by k) to read them in the undilated protocol's time.
func Dilate(k float64) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		for _, d := range []*time.Duration{&c.TCPTimeout, &c.PushPullInterval, &c.ProbeTimeout, &c.ProbeInterval,
			&c.GossipInterval, &c.GossipToTheDeadTime, &c.DeadNodeReclaimTime, &c.QueueCheckInterval} {
			*d = time.Duration(float64(*d) * k)
		}
	}
}
