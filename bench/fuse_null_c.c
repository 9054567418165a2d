/* The round-trip floor of this machine's FUSE, without Python: libfuse's low-level API over
 * handlers that do nothing, in one thread (fuse_session_loop), mounted with
 * default_permissions as tierd's door is (POSIX ACLs imply it), so a create costs the same
 * five requests it costs tierd: LOOKUP, CREATE, FLUSH, RELEASE and the parent's GETATTR.
 *
 * Built and run by bench/fuse_null.py --c (gcc and libfuse3-dev); by hand:
 *   gcc -O2 -pthread -o /tmp/fuse_null_c bench/fuse_null_c.c $(pkg-config fuse3 --cflags --libs)
 *   /tmp/fuse_null_c MOUNTPOINT [BACKING_DIR]   (foreground; unmount to stop it)
 * With FUSE_NULL_POLL_US set (microseconds) the loop reads the device again for that long
 * before it sleeps in poll(2), as tierd's kernel backend does (fuse_poll_us, fuse/kpoll.py;
 * a fixed window here).  With FUSE_NULL_AHEAD set too (and a BACKING_DIR), a second thread
 * makes the local files ahead, as tierd's spares do (tierd/namespace/spares.py).
 */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <poll.h>
#include <time.h>
#include <pthread.h>

#include "fuse_ahead.h"

#define MAXFILES (1 << 20)
static char *names[MAXFILES]; /* ino - 2 -> name; a flat directory */
static off_t sizes[MAXFILES];
static fuse_ino_t next_ino = 2;
static int backing_dir = -1; /* with a second argument: each new file gets a local file there */
static int backing_fd[MAXFILES];

static int ahead_on; /* FUSE_NULL_AHEAD: files made ahead (fuse_ahead.h) */

static int take_local(fuse_ino_t ino)
{
    return ahead_on ? ahead_take(ino) : ahead_make(ino);
}

static void attrs(fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_mode = ino == 1 ? (S_IFDIR | 0777) : (S_IFREG | 0644);
    st->st_nlink = ino == 1 ? 2 : 1;
    st->st_size = ino == 1 ? 0 : sizes[ino - 2];
    st->st_blksize = 1 << 20;
}

static void reply_entry(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    e.ino = ino;
    e.attr_timeout = e.entry_timeout = 300;
    attrs(ino, &e.attr);
    if (fi)
        fuse_reply_create(req, &e, fi);
    else
        fuse_reply_entry(req, &e);
}

#define HSIZE (MAXFILES * 2) /* open addressing, name -> ino */
static fuse_ino_t table[HSIZE];

static void slot(const char *name, fuse_ino_t **at)
{
    size_t h = 1469598103934665603ULL;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    for (h %= HSIZE;; h = (h + 1) % HSIZE)
        if (!table[h] || strcmp(names[table[h] - 2], name) == 0) {
            *at = &table[h];
            return;
        }
}

static fuse_ino_t find(const char *name)
{
    fuse_ino_t *at;
    slot(name, &at);
    return *at;
}

static void nl_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    (void)parent;
    fuse_ino_t ino = find(name);
    if (!ino)
        fuse_reply_err(req, ENOENT);
    else
        reply_entry(req, ino, NULL);
}

static void nl_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    attrs(ino, &st);
    fuse_reply_attr(req, &st, 300);
}

static void nl_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    (void)parent; (void)mode;
    fuse_ino_t ino = find(name);
    if (!ino) {
        if (next_ino - 2 >= MAXFILES) {
            fuse_reply_err(req, ENOSPC);
            return;
        }
        fuse_ino_t *at;
        slot(name, &at);
        ino = *at = next_ino++;
        names[ino - 2] = strdup(name);
        if (backing_dir >= 0) {
            /* what a passthrough create needs at least: the local file, open (tierd makes
             * it ahead in a worker thread; here it is made inline) */
            backing_fd[ino - 2] = take_local(ino);
            if (backing_fd[ino - 2] < 0) {
                fuse_reply_err(req, errno);
                return;
            }
        }
    }
    sizes[ino - 2] = 0;
    fi->fh = ino;
    reply_entry(req, ino, fi);
}

static void nl_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    fi->fh = ino;
    fuse_reply_open(req, fi);
}

static void nl_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    (void)buf; (void)fi;
    if (ino >= 2 && off + (off_t)size > sizes[ino - 2])
        sizes[ino - 2] = off + size;
    fuse_reply_write(req, size);
}

static void nl_ok(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino; (void)fi;
    fuse_reply_err(req, 0);
}

static void nl_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    if (backing_dir >= 0 && ino >= 2 && backing_fd[ino - 2] > 0) {
        close(backing_fd[ino - 2]);
        backing_fd[ino - 2] = 0;
    }
    fuse_reply_err(req, 0);
}

static void nl_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    (void)fi;
    if ((to_set & FUSE_SET_ATTR_SIZE) && ino >= 2)
        sizes[ino - 2] = attr->st_size;
    nl_getattr(req, ino, NULL);
}

static void nl_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    (void)ino; (void)name; (void)size;
    fuse_reply_err(req, ENODATA);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = nl_lookup, .getattr = nl_getattr, .create = nl_create, .open = nl_open,
    .write = nl_write, .flush = nl_ok, .release = nl_release, .setattr = nl_setattr,
    .getxattr = nl_getxattr,
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* fuse_session_loop, but reading the non-blocking device again for window_ns after it
 * found it empty, before it sleeps in poll(2) */
static int polling_loop(struct fuse_session *se, long long window_ns)
{
    int fd = fuse_session_fd(se);
    struct fuse_buf buf = {.mem = NULL};
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (!fuse_session_exited(se)) {
        int n = fuse_session_receive_buf(se, &buf);
        if (n == -EAGAIN || n == -EINTR) {
            long long end = now_ns() + window_ns;
            do
                n = fuse_session_receive_buf(se, &buf);
            while ((n == -EAGAIN || n == -EINTR) && now_ns() < end);
            if (n == -EAGAIN || n == -EINTR) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                poll(&p, 1, -1);
                continue;
            }
        }
        if (n <= 0) {
            if (n == -ENODEV || n == 0)
                break;
            free(buf.mem);
            return 1;
        }
        fuse_session_process_buf(se, &buf);
    }
    free(buf.mem);
    return 0;
}

int main(int argc, char *argv[])
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s MOUNTPOINT [BACKING_DIR]\n", argv[0]);
        return 2;
    }
    if (argc == 3 && (backing_dir = open(argv[2], O_DIRECTORY | O_RDONLY)) < 0) {
        perror(argv[2]);
        return 1;
    }
    char *fargv[] = {argv[0], "-o", "default_permissions,allow_other,fsname=fuse_null_c",
                     NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
    if (!se || fuse_session_mount(se, argv[1]) != 0)
        return 1;
    ahead_dir = backing_dir; /* (files made inline are made there too) */
    if (backing_dir >= 0 && getenv("FUSE_NULL_AHEAD")) {
        ahead_on = 1;
        ahead_start(backing_dir);
    }
    const char *poll_us = getenv("FUSE_NULL_POLL_US");
    int ret = poll_us ? polling_loop(se, atol(poll_us) * 1000) : fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return ret ? 1 : 0;
}
