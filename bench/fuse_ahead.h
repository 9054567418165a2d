/* Files made ahead by a second thread, as tierd's spares are (tierd/namespace/spares.py): a
 * ring of open descriptors on new empty files in one directory, for the C floors
 * bench/fuse_null_c.c and bench/fuse_null_uring.c (each includes this file; gcc finds it
 * beside them). */
#ifndef FUSE_AHEAD_H
#define FUSE_AHEAD_H
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>

#define AHEAD 256
static int ahead_dir = -1; /* where the files are made */
static int ahead_fd[AHEAD];
static unsigned ahead_head, ahead_tail; /* taken at head, made at tail */
static pthread_mutex_t ahead_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ahead_cv = PTHREAD_COND_INITIALIZER;

/* a new empty file in ahead_dir named for ``id``, open read-write (-1: refused) */
static int ahead_make(unsigned long id)
{
    char name[32];
    snprintf(name, sizeof(name), "%lx", id);
    return openat(ahead_dir, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
}

static void *ahead_thread(void *arg)
{
    (void)arg;
    unsigned long id = 1UL << 40; /* names apart from those made inline (a node's number) */
    for (;;) {
        pthread_mutex_lock(&ahead_mu);
        while (ahead_tail - ahead_head >= AHEAD)
            pthread_cond_wait(&ahead_cv, &ahead_mu);
        pthread_mutex_unlock(&ahead_mu);
        int fd = ahead_make(id++);
        if (fd < 0) {
            perror("making a file ahead"); /* (takers make their own from here) */
            return NULL;
        }
        pthread_mutex_lock(&ahead_mu);
        ahead_fd[ahead_tail++ % AHEAD] = fd;
        pthread_mutex_unlock(&ahead_mu);
    }
}

/* start making files ahead in directory ``dir`` */
static void ahead_start(int dir)
{
    pthread_t maker;
    ahead_dir = dir;
    pthread_create(&maker, NULL, ahead_thread, NULL);
    pthread_detach(maker);
}

/* a file made ahead, or made now (named for ``id``) when none is ready */
static int ahead_take(unsigned long id)
{
    int fd = -1;
    pthread_mutex_lock(&ahead_mu);
    if (ahead_tail != ahead_head) {
        fd = ahead_fd[ahead_head++ % AHEAD];
        pthread_cond_signal(&ahead_cv);
    }
    pthread_mutex_unlock(&ahead_mu);
    return fd >= 0 ? fd : ahead_make(id);
}
#endif
