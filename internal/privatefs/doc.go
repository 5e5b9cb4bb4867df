// Package privatefs is a pebble vfs.FS whose files and directories are the
// owner's alone: files 0600, directories 0700, whatever the process's umask.
//
// kvmesh keeps its own files under the data dir 0600 (node-id, segments,
// quotas); pebble (the NVMe index, the prefill queue) creates its files
// 0666 and its directories 0755 less the umask, which a process-wide umask
// would fix only for the whole process, the node's listeners and clients'
// sockets included. FS wraps another vfs.FS and narrows the mode of every
// file it creates or opens for writing, through the new descriptor
// (fchmod), and of every directory it makes. Between the open and the
// fchmod, a file is as its wrapped FS made it, inside a directory that is
// already 0700.
package privatefs
