/* The round-trip floor of this machine's FUSE over its two transports, without Python or
 * libfuse: the kernel protocol spoken directly, over handlers that do nothing, mounted with
 * default_permissions as tierd's door is, so a create costs the same five requests it costs
 * tierd (LOOKUP, CREATE, FLUSH, RELEASE and the parent's GETATTR).  The transport is the
 * second argument:
 *
 *   dev        one thread reads each request from /dev/fuse and answers it with writev(2),
 *              as tierd's kernel backend does (fuse/kdev.py);
 *   uring      FUSE over io_uring (kernel 6.14+, the fuse module's enable_uring on): one
 *              queue per possible CPU, each served by its own thread pinned to that CPU (not
 *              pinned with FUSE_NULL_URING_NOPIN set).  The kernel puts a request on the
 *              queue of the CPU its caller runs on and hands it to that queue's thread as
 *              task work; the answer and the fetch of the next request are one
 *              io_uring_enter(2);
 *   uring-one  the same queues, all served by one thread through one ring (pinned to the
 *              CPU FUSE_NULL_URING_PIN names, if set): what a single event loop could do.
 *
 * With FUSE_NULL_BACKING=DIR each create is a passthrough open, as tierd's are with write
 * passthrough (fuse/kpass.py): a second thread makes empty files in DIR ahead, as tierd's
 * spares are made (tierd/namespace/spares.py); a CREATE takes one, registers it with the
 * kernel (FUSE_DEV_IOC_BACKING_OPEN) and answers FOPEN_PASSTHROUGH with its backing id; the
 * RELEASE closes the backing id and the file.  What the kernel's hand-over of a backing
 * file costs a create, without tierd's namespace.  The served line then ends with
 * ", passthrough N": the creates answered so.
 *
 * Forgets and interrupts still come through /dev/fuse (the main thread), as does anything
 * that comes before every queue has its entries.  At unmount it prints on stderr how many
 * requests each path answered ("served: /dev/fuse N, queue 0 M, ...").
 *
 * Built and run by bench/fuse_uring.py (gcc; no libfuse); by hand, as root:
 *   gcc -O2 -pthread -o /tmp/fuse_null_uring bench/fuse_null_uring.c
 *   echo Y > /sys/module/fuse/parameters/enable_uring      # for the uring transports
 *   /tmp/fuse_null_uring MOUNTPOINT dev|uring|uring-one   (foreground; unmount to stop it)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuse_ahead.h"

/* include/uapi/linux/fuse.h, protocol 7.42 (these headers may be older) */
#define OVER_IO_URING_FLAGS2 (1u << (41 - 32))
struct uring_ent_in_out {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};
struct uring_req_header {
    char in_out[128];
    char op_in[128];
    struct uring_ent_in_out ent;
};
struct uring_cmd_req {
    uint64_t flags;
    uint64_t commit_id;
    uint16_t qid;
    uint8_t padding[6];
};
enum { CMD_REGISTER = 1, CMD_COMMIT_AND_FETCH = 2 };
/* passthrough (protocol 7.40): init flags2 bit, open flag, backing ioctls */
#define PASSTHROUGH_FLAGS2 (1u << (37 - 32))
#define OPEN_PASSTHROUGH (1u << 7)
struct backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define IOC_BACKING_OPEN _IOW(229, 1, struct backing_map)
#define IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

#define MAX_WRITE (128 * 1024)
#define PAYLOAD (1 << 20) /* >= the kernel's max_payload_sz for MAX_WRITE */
#define DEPTH 2           /* ring entries per queue */
#define NO_REPLY 1        /* a handler's answer for requests that get none */

static int devfd;
static uint64_t next_ino = 2;

/* -- passthrough (FUSE_NULL_BACKING): files made ahead, one backing id per created node -- */
#define MAXNODES (1 << 20)
static int node_fd[MAXNODES];          /* the node's local file */
static int32_t node_backing[MAXNODES]; /* its backing id */
static unsigned long backed;           /* creates answered as passthrough opens */

/* a file made ahead, registered with the kernel: its backing id (-errno: none to be had) */
static int32_t backing_for(uint64_t ino)
{
    if (ino >= MAXNODES)
        return -EFBIG;
    int fd = ahead_take(ino);
    if (fd < 0)
        return -errno;
    struct backing_map map = {.fd = fd};
    int id = ioctl(devfd, IOC_BACKING_OPEN, &map);
    if (id <= 0) {
        perror("FUSE_DEV_IOC_BACKING_OPEN");
        exit(1);
    }
    node_fd[ino] = fd;
    node_backing[ino] = id;
    __atomic_fetch_add(&backed, 1, __ATOMIC_RELAXED);
    return id;
}

static void backing_release(uint64_t ino)
{
    if (ino >= MAXNODES || node_backing[ino] <= 0)
        return;
    uint32_t id = (uint32_t)node_backing[ino];
    if (ioctl(devfd, IOC_BACKING_CLOSE, &id) < 0)
        perror("FUSE_DEV_IOC_BACKING_CLOSE");
    close(node_fd[ino]);
    node_backing[ino] = 0;
}

static unsigned long served[64 + 1]; /* requests answered per queue; [64]: through /dev/fuse */

static void attr_of(struct fuse_attr *a, uint64_t ino)
{
    memset(a, 0, sizeof(*a));
    a->ino = ino;
    a->mode = ino == FUSE_ROOT_ID ? (S_IFDIR | 0777) : (S_IFREG | 0644);
    a->nlink = ino == FUSE_ROOT_ID ? 2 : 1;
    a->blksize = 4096;
}

/* The answer to one request: its body in out, its length returned, or -errno, or NO_REPLY.
 * The handlers look at nothing but the opcode and the node (and a RELEASE's handle in
 * ``body``, the operation's own header: after the common one on /dev/fuse, in the ring
 * entry's op_in over io_uring). */
static int handle(const struct fuse_in_header *in, const char *body, char *out)
{
    switch (in->opcode) {
    case FUSE_LOOKUP:
        return -ENOENT;
    case FUSE_GETATTR:
    case FUSE_SETATTR: {
        struct fuse_attr_out *o = (void *)out;
        memset(o, 0, sizeof(*o));
        o->attr_valid = 1;
        attr_of(&o->attr, in->nodeid);
        return sizeof(*o);
    }
    case FUSE_CREATE: {
        struct fuse_entry_out *e = (void *)out;
        struct fuse_open_out *o = (void *)(out + sizeof(*e));
        memset(e, 0, sizeof(*e) + sizeof(*o));
        e->nodeid = __atomic_fetch_add(&next_ino, 1, __ATOMIC_RELAXED);
        e->entry_valid = e->attr_valid = 1;
        attr_of(&e->attr, e->nodeid);
        if (ahead_dir >= 0) {
            int32_t id = backing_for(e->nodeid);
            if (id < 0)
                return id;
            o->open_flags = OPEN_PASSTHROUGH;
            memcpy((char *)o + 12, &id, sizeof(id)); /* fuse_open_out.backing_id */
            o->fh = e->nodeid;
        }
        return sizeof(*e) + sizeof(*o);
    }
    case FUSE_RELEASE:
        if (ahead_dir >= 0)
            backing_release(((const struct fuse_release_in *)body)->fh);
        return 0;
    case FUSE_OPEN:
    case FUSE_OPENDIR:
        memset(out, 0, sizeof(struct fuse_open_out));
        return sizeof(struct fuse_open_out);
    case FUSE_STATFS: {
        struct fuse_statfs_out *s = (void *)out;
        memset(s, 0, sizeof(*s));
        s->st.bsize = s->st.frsize = 4096;
        s->st.namelen = 255;
        return sizeof(*s);
    }
    case FUSE_FLUSH:
    case FUSE_RELEASEDIR:
    case FUSE_FSYNC:
    case FUSE_ACCESS:
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
        return 0;
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
        return NO_REPLY;
    default:
        return -ENOSYS;
    }
}

static void init_reply(const char *buf, int uring)
{
    const struct fuse_in_header *in = (const void *)buf;
    const struct fuse_init_in *ii = (const void *)(buf + sizeof(*in));
    struct {
        struct fuse_out_header h;
        struct fuse_init_out o;
    } r;
    memset(&r, 0, sizeof(r));
    r.h.len = sizeof(r);
    r.h.unique = in->unique;
    r.o.major = FUSE_KERNEL_VERSION;
    r.o.minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor : FUSE_KERNEL_MINOR_VERSION;
    r.o.max_readahead = ii->max_readahead;
    r.o.flags = (ii->flags & (FUSE_MAX_PAGES | FUSE_INIT_EXT));
    r.o.flags2 = (uring ? OVER_IO_URING_FLAGS2 : 0) | (ahead_dir >= 0 ? PASSTHROUGH_FLAGS2 : 0);
    if (ahead_dir >= 0) {
        /* fuse_init_out.max_stack_depth (7.40) is at byte 36, whatever this header's version
         * names it (7.38's unused[0], a field of its own from 7.40): a backing file on a
         * plain file system */
        uint32_t depth = 1;
        memcpy((char *)&r.o + 36, &depth, sizeof(depth));
    }
    r.o.max_background = 64;
    r.o.congestion_threshold = 48;
    r.o.max_write = MAX_WRITE;
    r.o.time_gran = 1;
    r.o.max_pages = MAX_WRITE / 4096;
    if (write(devfd, &r, sizeof(r)) != sizeof(r)) {
        perror("INIT reply");
        exit(1);
    }
}

/* -- io_uring, by its system calls (no liburing) ----------------------------------------- */
struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    char *sqes; /* 128 bytes each (IORING_SETUP_SQE128) */
    struct io_uring_cqe *cqes;
    unsigned tail;
};

static int ring_setup(struct ring *r, unsigned entries)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_SQE128;
    r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0)
        return -1;
    size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_sz > sq_sz)
        sq_sz = cq_sz; /* one mapping for both (IORING_FEAT_SINGLE_MMAP, 5.4+) */
    char *sq = mmap(NULL, sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                    IORING_OFF_SQ_RING);
    r->sqes = mmap(NULL, p.sq_entries * 128, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || r->sqes == MAP_FAILED)
        return -1;
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(sq + p.cq_off.head);
    r->cq_tail = (unsigned *)(sq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(sq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(sq + p.cq_off.cqes);
    r->tail = *r->sq_tail;
    return 0;
}

/* queue one FUSE command on the ring (submitted at the next io_uring_enter) */
static void ring_cmd(struct ring *r, uint32_t cmd, uint64_t data, struct iovec *iov,
                     uint16_t qid, uint64_t commit_id)
{
    unsigned idx = r->tail & *r->sq_mask;
    struct io_uring_sqe *sqe = (void *)(r->sqes + (size_t)idx * 128);
    memset(sqe, 0, 128);
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = devfd;
    sqe->cmd_op = cmd;
    sqe->user_data = data;
    if (iov) {
        sqe->addr = (uint64_t)(uintptr_t)iov;
        sqe->len = 2;
    }
    struct uring_cmd_req *req = (void *)sqe->cmd;
    req->commit_id = commit_id;
    req->qid = qid;
    r->sq_array[idx] = idx;
    r->tail++;
    __atomic_store_n(r->sq_tail, r->tail, __ATOMIC_RELEASE);
}

#define MAXQ 64
/* the kernel makes one queue per possible CPU (num_possible_cpus), which can be more than
 * are present: the count of /sys/devices/system/cpu/possible ("0-3,8-11") */
static int possible_cpus(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
    int n = 0, lo, hi;
    char sep;
    if (!f)
        return get_nprocs_conf();
    while (fscanf(f, "%d", &lo) == 1) {
        hi = lo;
        if (fscanf(f, "%c", &sep) == 1 && sep == '-') {
            if (fscanf(f, "%d", &hi) != 1)
                break;
            if (fscanf(f, "%c", &sep) != 1)
                sep = '\n';
        }
        n += hi - lo + 1;
        if (sep != ',')
            break;
    }
    fclose(f);
    return n;
}

struct queue {
    int qid; /* its queue (the first of all with "one") */
    int cpu; /* the CPU the thread is pinned to (-1: none) */
    int nq;  /* the queues this thread's ring serves: all with "one", else its own */
    struct ring ring;
    struct uring_req_header *hdr[MAXQ * DEPTH];
    char *payload[MAXQ * DEPTH];
    struct iovec iov[MAXQ * DEPTH][2];
    uint16_t of[MAXQ * DEPTH]; /* each entry's queue id */
};

static void *queue_thread(void *arg)
{
    struct queue *q = arg;
    if (q->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(q->cpu, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
    int base = q->qid;
    unsigned ents = (unsigned)(q->nq * DEPTH), pending = 0;
    if (ring_setup(&q->ring, 2 * ents) < 0) {
        perror("io_uring_setup"); /* (io_uring off here: /dev/fuse serves on) */
        return NULL;
    }
    for (int i = 0; i < (int)ents; i++) {
        q->of[i] = (uint16_t)(base + i / DEPTH);
        q->hdr[i] = aligned_alloc(4096, 4096);
        q->payload[i] = aligned_alloc(4096, PAYLOAD);
        memset(q->hdr[i], 0, 4096);
        q->iov[i][0] = (struct iovec){q->hdr[i], sizeof(struct uring_req_header)};
        q->iov[i][1] = (struct iovec){q->payload[i], PAYLOAD};
        ring_cmd(&q->ring, CMD_REGISTER, (uint64_t)i, q->iov[i], q->of[i], 0);
        pending++;
    }
    char out[4096];
    for (;;) {
        int n = (int)syscall(__NR_io_uring_enter, q->ring.fd, pending, 1,
                             IORING_ENTER_GETEVENTS, NULL, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("io_uring_enter");
            return NULL;
        }
        pending -= (unsigned)n < pending ? (unsigned)n : pending;
        unsigned head = *q->ring.cq_head;
        while (head != __atomic_load_n(q->ring.cq_tail, __ATOMIC_ACQUIRE)) {
            struct io_uring_cqe *cqe = &q->ring.cqes[head & *q->ring.cq_mask];
            int i = (int)cqe->user_data;
            head++;
            if (cqe->res < 0) {
                if (cqe->res == -ENOTCONN || cqe->res == -ECONNABORTED)
                    return NULL; /* unmounted */
                /* refused (enable_uring off: EOPNOTSUPP): /dev/fuse keeps serving */
                fprintf(stderr, "queue %d: %s\n", q->qid, strerror(-cqe->res));
                return NULL;
            }
            struct uring_req_header *h = q->hdr[i];
            served[q->of[i] & 63]++;
            struct fuse_in_header in = *(struct fuse_in_header *)h->in_out;
            int len = handle(&in, h->op_in, out);
            if (len == NO_REPLY)
                len = -ENOSYS; /* (forgets come through /dev/fuse) */
            struct fuse_out_header *o = (void *)h->in_out;
            o->unique = in.unique;
            o->error = len < 0 ? len : 0;
            o->len = (uint32_t)(sizeof(*o) + (len > 0 ? len : 0));
            if (len > 0)
                memcpy(q->payload[i], out, (size_t)len);
            h->ent.payload_sz = len > 0 ? (uint32_t)len : 0;
            ring_cmd(&q->ring, CMD_COMMIT_AND_FETCH, (uint64_t)i, NULL, q->of[i],
                     h->ent.commit_id);
            pending++;
        }
        __atomic_store_n(q->ring.cq_head, head, __ATOMIC_RELEASE);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MOUNTPOINT dev|uring\n", argv[0]);
        return 2;
    }
    int uring = strncmp(argv[2], "uring", 5) == 0;
    int one = strcmp(argv[2], "uring-one") == 0; /* one thread, one ring, every queue */
    const char *pin = getenv("FUSE_NULL_URING_PIN"); /* uring-one: the CPU of its thread */
    const char *backing = getenv("FUSE_NULL_BACKING");
    if (backing) {
        int dir = open(backing, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
        if (dir < 0) {
            perror(backing);
            return 1;
        }
        ahead_start(dir);
    }
    devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (devfd < 0) {
        perror("/dev/fuse");
        return 1;
    }
    char opts[256];
    snprintf(opts, sizeof(opts),
             "fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other",
             devfd);
    if (mount("fuse_null", argv[1], "fuse.fuse_null", MS_NOSUID | MS_NODEV, opts) < 0) {
        perror("mount");
        return 1;
    }
    static char buf[MAX_WRITE + 4096];
    char out[4096];
    int started = 0;
    for (;;) {
        ssize_t n = read(devfd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT)
                continue;
            if (errno == ENODEV) { /* unmounted: what each path answered, on stderr */
                fprintf(stderr, "served: /dev/fuse %lu", served[64]);
                for (int qid = 0; qid < possible_cpus() && qid < 64; qid++)
                    fprintf(stderr, ", queue %d %lu", qid, served[qid]);
                if (ahead_dir >= 0)
                    fprintf(stderr, ", passthrough %lu", backed);
                fprintf(stderr, "\n");
                _exit(0);
            }
            perror("read /dev/fuse");
            _exit(1);
        }
        const struct fuse_in_header *in = (const void *)buf;
        if (in->opcode == FUSE_INIT) {
            init_reply(buf, uring);
            int nq = possible_cpus();
            if (uring && nq > MAXQ)
                fprintf(stderr, "%d possible CPUs: more queues than this daemon serves\n", nq);
            else if (uring && !started) {
                for (int qid = 0; qid < (one ? 1 : nq); qid++) {
                    struct queue *q = calloc(1, sizeof(*q));
                    q->qid = qid;
                    q->cpu = one ? (pin ? atoi(pin) : -1)
                                 : getenv("FUSE_NULL_URING_NOPIN") ? -1 : qid;
                    q->nq = one ? nq : 1;
                    pthread_t t;
                    pthread_create(&t, NULL, queue_thread, q);
                }
                started = 1;
            }
            continue;
        }
        served[64]++;
        int len = handle(in, buf + sizeof(*in), out);
        if (len == NO_REPLY)
            continue;
        struct fuse_out_header o = {
            .len = (uint32_t)(sizeof(o) + (len > 0 ? len : 0)),
            .error = len < 0 ? len : 0,
            .unique = in->unique,
        };
        struct iovec iov[2] = {{&o, sizeof(o)}, {out, len > 0 ? (size_t)len : 0}};
        if (writev(devfd, iov, len > 0 ? 2 : 1) < 0 && errno != ENOENT)
            perror("writev /dev/fuse");
    }
}
