//go:build ucx && linux && cgo

#include "ucx_glue.h"

#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The UCP functions kvmesh calls, looked up once by kvu_load.
static struct {
	ucs_status_t (*config_read)(const char *, const char *, ucp_config_t **);
	void (*config_release)(ucp_config_t *);
	ucs_status_t (*config_modify)(ucp_config_t *, const char *, const char *);
	ucs_status_t (*init_version)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *);
	void (*cleanup)(ucp_context_h);
	ucs_status_t (*context_query)(ucp_context_h, ucp_context_attr_t *);
	void (*context_print_info)(const ucp_context_h, FILE *);
	ucs_status_t (*worker_create)(ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *);
	void (*worker_destroy)(ucp_worker_h);
	ucs_status_t (*worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
	void (*worker_release_address)(ucp_worker_h, ucp_address_t *);
	unsigned (*worker_progress)(ucp_worker_h);
	ucs_status_t (*worker_get_efd)(ucp_worker_h, int *);
	ucs_status_t (*worker_arm)(ucp_worker_h);
	ucs_status_t (*worker_signal)(ucp_worker_h);
	ucs_status_t (*mem_map)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);
	ucs_status_t (*mem_unmap)(ucp_context_h, ucp_mem_h);
	ucs_status_t (*rkey_pack)(ucp_context_h, ucp_mem_h, void **, size_t *);
	void (*rkey_buffer_release)(void *);
	ucs_status_t (*ep_rkey_unpack)(ucp_ep_h, const void *, ucp_rkey_h *);
	void (*rkey_destroy)(ucp_rkey_h);
	ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
	ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
	void (*ep_print_info)(ucp_ep_h, FILE *);
	ucs_status_ptr_t (*get_nbx)(ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *);
	ucs_status_t (*request_check_status)(void *);
	void (*request_free)(void *);
	const char *(*status_string)(ucs_status_t);
	void (*get_version)(unsigned *, unsigned *, unsigned *);
} U;

static int loaded;

#define SYM(field, name)                                                         \
	do {                                                                     \
		*(void **)(&U.field) = dlsym(h, name);                           \
		if (U.field == NULL) {                                           \
			snprintf(err, errlen, "%s: no symbol %s", lib, name);     \
			dlclose(h);                                              \
			return -1;                                               \
		}                                                                \
	} while (0)

int kvu_load(const char *lib, char *err, size_t errlen) {
	if (lib == NULL || lib[0] == '\0') {
		lib = "libucp.so.0";
	}
	// Loaded once per process; a second call still checks that lib opens.
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	if (loaded) {
		dlclose(h);
		return 0;
	}
	SYM(config_read, "ucp_config_read");
	SYM(config_release, "ucp_config_release");
	SYM(config_modify, "ucp_config_modify");
	SYM(init_version, "ucp_init_version");
	SYM(cleanup, "ucp_cleanup");
	SYM(context_query, "ucp_context_query");
	SYM(context_print_info, "ucp_context_print_info");
	SYM(worker_create, "ucp_worker_create");
	SYM(worker_destroy, "ucp_worker_destroy");
	SYM(worker_get_address, "ucp_worker_get_address");
	SYM(worker_release_address, "ucp_worker_release_address");
	SYM(worker_progress, "ucp_worker_progress");
	SYM(worker_get_efd, "ucp_worker_get_efd");
	SYM(worker_arm, "ucp_worker_arm");
	SYM(worker_signal, "ucp_worker_signal");
	SYM(mem_map, "ucp_mem_map");
	SYM(mem_unmap, "ucp_mem_unmap");
	SYM(rkey_pack, "ucp_rkey_pack");
	SYM(rkey_buffer_release, "ucp_rkey_buffer_release");
	SYM(ep_rkey_unpack, "ucp_ep_rkey_unpack");
	SYM(rkey_destroy, "ucp_rkey_destroy");
	SYM(ep_create, "ucp_ep_create");
	SYM(ep_close_nbx, "ucp_ep_close_nbx");
	SYM(ep_print_info, "ucp_ep_print_info");
	SYM(get_nbx, "ucp_get_nbx");
	SYM(request_check_status, "ucp_request_check_status");
	SYM(request_free, "ucp_request_free");
	SYM(status_string, "ucs_status_string"); // libucs, a dependency of libucp
	SYM(get_version, "ucp_get_version");
	loaded = 1;
	return 0;
}

uint32_t kvu_version(void) {
	unsigned major, minor, release;
	U.get_version(&major, &minor, &release);
	return (major & 0xff) << 16 | (minor & 0xff) << 8 | (release & 0xff);
}

const char *kvu_status(ucs_status_t s) {
	return loaded ? U.status_string(s) : "UCX not loaded";
}

ucs_status_t kvu_open(const char *tls, const char *devices, kvu_ctx **out) {
	ucp_config_t *cfg;
	ucs_status_t st = U.config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		return st;
	}
	if (tls != NULL && tls[0] != '\0' && (st = U.config_modify(cfg, "TLS", tls)) != UCS_OK) {
		U.config_release(cfg);
		return st;
	}
	if (devices != NULL && devices[0] != '\0' && (st = U.config_modify(cfg, "NET_DEVICES", devices)) != UCS_OK) {
		U.config_release(cfg);
		return st;
	}
	kvu_ctx *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		U.config_release(cfg);
		return UCS_ERR_NO_MEMORY;
	}
	ucp_params_t p = {0};
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
	p.name = "kvmesh";
	st = U.init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &c->ctx);
	U.config_release(cfg);
	if (st != UCS_OK) {
		free(c);
		return st;
	}
	ucp_context_attr_t attr = {0};
	attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	if (U.context_query(c->ctx, &attr) == UCS_OK) {
		c->mem_types = attr.memory_types;
	}
	ucp_worker_params_t wp = {0};
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	if ((st = U.worker_create(c->ctx, &wp, &c->worker)) != UCS_OK) {
		U.cleanup(c->ctx);
		free(c);
		return st;
	}
	ucp_address_t *addr;
	if ((st = U.worker_get_efd(c->worker, &c->efd)) != UCS_OK ||
	    (st = U.worker_get_address(c->worker, &addr, &c->addr_len)) != UCS_OK) {
		U.worker_destroy(c->worker);
		U.cleanup(c->ctx);
		free(c);
		return st;
	}
	// A copy of our own, so that the worker's is released at once.
	c->addr = malloc(c->addr_len);
	if (c->addr == NULL) {
		U.worker_release_address(c->worker, addr);
		U.worker_destroy(c->worker);
		U.cleanup(c->ctx);
		free(c);
		return UCS_ERR_NO_MEMORY;
	}
	memcpy(c->addr, addr, c->addr_len);
	U.worker_release_address(c->worker, addr);
	*out = c;
	return UCS_OK;
}

void kvu_close(kvu_ctx *c) {
	U.worker_destroy(c->worker);
	U.cleanup(c->ctx);
	free(c->addr);
	free(c);
}

// print runs fn into a memory stream and copies at most len-1 bytes of it
// into buf.
static size_t print(void (*fn)(void *, FILE *), void *obj, char *buf, size_t len) {
	char *text = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&text, &n);
	if (f == NULL) {
		buf[0] = '\0';
		return 0;
	}
	fn(obj, f);
	fclose(f);
	if (n >= len) {
		n = len - 1;
	}
	memcpy(buf, text, n);
	buf[n] = '\0';
	free(text);
	return n;
}

static void print_context(void *c, FILE *f) { U.context_print_info(((kvu_ctx *)c)->ctx, f); }
static void print_ep(void *e, FILE *f) { U.ep_print_info(((kvu_ep *)e)->ep, f); }

size_t kvu_info(kvu_ctx *c, char *buf, size_t len) { return print(print_context, c, buf, len); }
size_t kvu_ep_info(kvu_ep *e, char *buf, size_t len) { return print(print_ep, e, buf, len); }

ucs_status_t kvu_map(kvu_ctx *c, void *addr, size_t len, ucp_mem_h *memh) {
	ucp_mem_map_params_t p = {0};
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = addr;
	p.length = len;
	return U.mem_map(c->ctx, &p, memh);
}

ucs_status_t kvu_unmap(kvu_ctx *c, ucp_mem_h memh) { return U.mem_unmap(c->ctx, memh); }

ucs_status_t kvu_pack(kvu_ctx *c, ucp_mem_h memh, void **rkey, size_t *len) {
	return U.rkey_pack(c->ctx, memh, rkey, len);
}

void kvu_pack_release(void *rkey) { U.rkey_buffer_release(rkey); }

// on_error is the endpoint's error handler: it runs in ucp_worker_progress,
// on the progress thread, and only records the failure.
static void on_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
	(void)ep;
	((kvu_ep *)arg)->failed = status;
}

ucs_status_t kvu_connect(kvu_ctx *c, const void *addr, int peer, kvu_ep *e) {
	ucp_ep_params_t p = {0};
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		       UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	p.err_handler.cb = on_error;
	p.err_handler.arg = e;
	e->failed = UCS_OK;
	e->rkey = NULL;
	return U.ep_create(c->worker, &p, &e->ep);
}

ucs_status_t kvu_rkey(kvu_ep *e, const void *rkey) { return U.ep_rkey_unpack(e->ep, rkey, &e->rkey); }

void *kvu_close_ep(kvu_ctx *c, kvu_ep *e, int force) {
	(void)c;
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	ucs_status_ptr_t r = U.ep_close_nbx(e->ep, &p);
	e->ep = NULL;
	if (r == NULL || UCS_PTR_IS_ERR(r)) {
		return NULL;
	}
	return r;
}

void kvu_rkey_destroy(kvu_ep *e) {
	if (e->rkey != NULL) {
		U.rkey_destroy(e->rkey);
		e->rkey = NULL;
	}
}

ucs_status_t kvu_get(kvu_ep *e, void *dst, size_t len, uint64_t raddr, ucp_mem_h memh, void **req) {
	ucp_request_param_t p = {0};
	if (memh != NULL) {
		p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		p.memh = memh;
	}
	*req = NULL;
	ucs_status_ptr_t r = U.get_nbx(e->ep, dst, len, raddr, e->rkey, &p);
	if (r == NULL) {
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(r)) {
		return UCS_PTR_STATUS(r);
	}
	*req = r;
	return UCS_INPROGRESS;
}

ucs_status_t kvu_check(void *req) {
	ucs_status_t st = U.request_check_status(req);
	if (st != UCS_INPROGRESS) {
		U.request_free(req);
	}
	return st;
}

unsigned kvu_progress(kvu_ctx *c) {
	unsigned n = 0, k;
	while ((k = U.worker_progress(c->worker)) != 0) {
		n += k;
	}
	return n;
}

void kvu_wait(kvu_ctx *c, int timeout_ms) {
	if (U.worker_arm(c->worker) != UCS_OK) {
		return; // busy (events to progress) or broken: the caller progresses
	}
	struct pollfd pfd = {.fd = c->efd, .events = POLLIN};
	poll(&pfd, 1, timeout_ms);
}

void kvu_signal(kvu_ctx *c) { U.worker_signal(c->worker); }
