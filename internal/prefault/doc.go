// Package prefault backs shared memory with pages before a bulk write into
// it, in one system call instead of one page fault per page.
//
// A store's arena is a shared mapping of a memfd (tiers.DRAM), written by
// the node and by same-host clients that map it. Writing a value into pages
// that are not yet in memory faults once per 4 KiB page, and where the pages
// are in memory but not yet mapped by the writing process (the other
// process put them there) it still faults once per page to map them. On the
// shared 2-vCPU VM of BENCHMARKS.md, a 4 MiB copy took 2.2 ms into new
// pages, 1.8 ms into pages another mapping had touched, and 0.5 ms into
// pages already mapped; populating the range first (MADV_POPULATE_WRITE,
// Linux 5.14) took the middle case to 0.8 ms and the first to 1.8 ms.
package prefault
