//go:build ucx && linux && cgo

// The C side of transfer's UCX fabric (ucx.go): a thin layer over UCP that
// loads libucp at run time (dlopen), so that a ucx build starts on a host
// without UCX and says so. Every function but kvu_load and kvu_signal runs
// on the fabric's progress thread: the worker is single-threaded.
#ifndef KVMESH_UCX_GLUE_H
#define KVMESH_UCX_GLUE_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

// A UCP context and its one worker.
typedef struct kvu_ctx {
	ucp_context_h ctx;
	ucp_worker_h  worker;
	int           efd;       // the worker's event descriptor
	void         *addr;      // the worker's address
	size_t        addr_len;
	uint64_t      mem_types; // bit i: UCX can register memory of ucs_memory_type_t i
} kvu_ctx;

// An endpoint to a peer's worker, and the remote key of the region read
// through it.
typedef struct kvu_ep {
	ucp_ep_h     ep;
	ucp_rkey_h   rkey;
	ucs_status_t failed; // set by the error handler: UCS_OK while healthy
} kvu_ep;

// kvu_load opens the UCX library lib (NULL: libucp.so.0). It returns 0, or
// -1 with err filled.
int kvu_load(const char *lib, char *err, size_t errlen);

// kvu_open makes a context (features RMA and WAKEUP, UCX_* environment and
// the overrides: tls and devices, NULL or "" for none) and its worker.
ucs_status_t kvu_open(const char *tls, const char *devices, kvu_ctx **out);
void kvu_close(kvu_ctx *c);
// kvu_version is the loaded library's version: major << 16 | minor << 8 | release.
uint32_t kvu_version(void);
const char *kvu_status(ucs_status_t s);

// kvu_info writes ucp_context_print_info's text into buf (at most len
// bytes, NUL-terminated) and returns its length.
size_t kvu_info(kvu_ctx *c, char *buf, size_t len);
// kvu_ep_info does the same for an endpoint's configuration.
size_t kvu_ep_info(kvu_ep *e, char *buf, size_t len);

// Memory: register [addr, addr+len) and pack its remote key.
ucs_status_t kvu_map(kvu_ctx *c, void *addr, size_t len, ucp_mem_h *memh);
ucs_status_t kvu_unmap(kvu_ctx *c, ucp_mem_h memh);
ucs_status_t kvu_pack(kvu_ctx *c, ucp_mem_h memh, void **rkey, size_t *len);
void kvu_pack_release(void *rkey);

// Endpoints: connect to a worker address (peer error handling), unpack a
// remote key for it, close it (force: without the peer).
ucs_status_t kvu_connect(kvu_ctx *c, const void *addr, int peer, kvu_ep *e);
ucs_status_t kvu_rkey(kvu_ep *e, const void *rkey);
// kvu_close_ep starts closing e and returns the request to wait on with
// kvu_check (NULL: closed); its outstanding gets complete (force: with an
// error). kvu_rkey_destroy then frees the remote key.
void *kvu_close_ep(kvu_ctx *c, kvu_ep *e, int force);
void kvu_rkey_destroy(kvu_ep *e);

// kvu_get starts a get of len bytes at raddr into dst (registered as memh,
// may be NULL). It returns UCS_OK with *req NULL when done at once,
// UCS_INPROGRESS with *req to wait on, or an error.
ucs_status_t kvu_get(kvu_ep *e, void *dst, size_t len, uint64_t raddr, ucp_mem_h memh, void **req);
// kvu_check returns a request's status; a final one frees the request.
ucs_status_t kvu_check(void *req);

// Progress: kvu_progress progresses until nothing happens and returns how
// many events it handled; kvu_wait arms the worker and waits for an event
// or a signal, at most timeout_ms (returns at once if the worker is busy).
unsigned kvu_progress(kvu_ctx *c);
void kvu_wait(kvu_ctx *c, int timeout_ms);
// kvu_signal wakes kvu_wait; any thread may call it.
void kvu_signal(kvu_ctx *c);

#endif
