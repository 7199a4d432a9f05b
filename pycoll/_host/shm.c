#include "shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static char tag_text[SHM_TAG_MAX + 1], prefix_text[sizeof "pycoll_" + SHM_TAG_MAX];
static pthread_once_t tag_once = PTHREAD_ONCE_INIT;

static void tag_read(void) {
  const char* v = getenv("PYCOLL_HOST_SHM_TAG");
  const char* e = v ? v + strspn(v, " \t") : ""; /* the blanks the other variables' parsers skip (env.c) */
  size_t n = strlen(e);
  while (n && (e[n - 1] == ' ' || e[n - 1] == '\t' || e[n - 1] == '\n')) n--;
  bool ok = n <= SHM_TAG_MAX;
  for (size_t i = 0; ok && i < n; i++)
    ok = (e[i] >= 'a' && e[i] <= 'z') || (e[i] >= 'A' && e[i] <= 'Z') || (e[i] >= '0' && e[i] <= '9') || e[i] == '_';
  if (!ok) {
    fprintf(stderr, "pycoll host library: WARN PYCOLL_HOST_SHM_TAG=%s is invalid: it must be 1 to %d of A-Z, a-z, "
            "0-9 and _; using none\n", v, SHM_TAG_MAX);
    fflush(stderr);
    n = 0;
  }
  memcpy(tag_text, e, n);
  tag_text[n] = 0;
  snprintf(prefix_text, sizeof prefix_text, n ? "pycoll_%s" : "pycoll", tag_text);
}

const char* shm_tag(void) {
  pthread_once(&tag_once, tag_read);
  return tag_text;
}

const char* shm_prefix(void) {
  pthread_once(&tag_once, tag_read);
  return prefix_text;
}

/* The start time of process `pid` (0: none such, or unreadable: `*unknown` then says which). */
static uint64_t read_start_time(int32_t pid, char* state, bool* unknown) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (unknown) *unknown = errno != ENOENT && errno != ESRCH; /* out of descriptors, no /proc to read... */
    return 0;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char* p = strrchr(buf, ')');
  if (!p) return 0;
  p += 2; /* field 3: state */
  if (state) *state = *p;
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  return p ? strtoull(p, NULL, 10) : 0;
}

static uint64_t read_pidns(void) {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return (uint64_t)st.st_ino;
}

void proc_self(struct proc_id* out) {
  static struct proc_id cached;
  static pid_t cached_pid;
  pid_t me = getpid();
  if (cached_pid != me) { /* recompute after fork */
    cached.pid = me;
    cached.start = read_start_time(me, NULL, NULL);
    cached.pidns = read_pidns();
    cached_pid = me;
  }
  *out = cached;
}

int proc_alive(const struct proc_id* p) {
  struct proc_id me;
  proc_self(&me);
  if (p->pid <= 0 || p->pidns != me.pidns || me.start == 0) return -1; /* me.start 0: no /proc to read */
  char state = 0;
  bool unknown = false;
  uint64_t start = read_start_time(p->pid, &state, &unknown);
  if (start == 0) return unknown ? -1 : 0;
  if (p->start && start != p->start) return 0;
  if (state == 'Z' || state == 'X') return 0;
  return 1;
}

int host_boot_id(uint8_t out[16]) {
  static uint8_t cached[16];
  static int have;
  if (!have) {
    char buf[64] = {0};
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t n = read(fd, buf, sizeof buf - 1);
      close(fd);
      int k = 0;
      for (ssize_t i = 0; i < n && k < 32; i++) {
        char c = buf[i];
        int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (v < 0) continue;
        cached[k / 2] = (uint8_t)(cached[k / 2] << 4 | v);
        k++;
      }
    }
    have = 1;
  }
  memcpy(out, cached, 16);
  return 0;
}

const char* host_name(void) {
  static char name[64];
  if (!name[0]) {
    gethostname(name, sizeof name - 1);
    if (!name[0]) strcpy(name, "localhost");
  }
  return name;
}

int random_bytes(void* buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = getrandom((char*)buf + got, len - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)n;
  }
  return 0;
}

static void path_of(char* out, size_t len, const char* name) {
  snprintf(out, len, "%s/%s", SHM_DIR, name[0] == '/' ? name + 1 : name);
}

int shm_open_map(const char* name, void** base, size_t* size) {
  char path[256];
  path_of(path, sizeof path, name);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  void* p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return e;
  *base = p;
  *size = (size_t)st.st_size;
  return 0;
}

/* shm_create_map takes a segment's pages at once where less than this many segments' worth is free */
#define RESERVE_FACTOR 16

static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mapped {
  void* base;
  size_t size;
} * maps;
static int nmaps, capmaps;

void shm_note_mapped(void* base, size_t size, bool mapped) {
  pthread_mutex_lock(&maps_mu);
  if (mapped) {
    if (nmaps == capmaps) {
      int cap = capmaps ? 2 * capmaps : 16;
      struct mapped* m = realloc(maps, (size_t)cap * sizeof *m);
      if (m) maps = m, capmaps = cap;
    }
    if (nmaps < capmaps) maps[nmaps++] = (struct mapped){base, size};
  } else {
    for (int i = 0; i < nmaps; i++)
      if (maps[i].base == base) {
        maps[i] = maps[--nmaps];
        break;
      }
  }
  pthread_mutex_unlock(&maps_mu);
}

/* The bytes of this process's mapped segments that no page backs yet (mincore: a page nobody touched is not in the
 * page cache): room /dev/shm's free space does not show as taken, but which they take at their first touch. */
uint64_t shm_unbacked_bytes(void) {
  long page = sysconf(_SC_PAGESIZE);
  uint64_t total = 0;
  unsigned char* vec = NULL;
  size_t veclen = 0;
  pthread_mutex_lock(&maps_mu);
  for (int i = 0; i < nmaps; i++) {
    size_t n = (maps[i].size + (size_t)page - 1) / (size_t)page;
    if (n > veclen) {
      unsigned char* v = realloc(vec, n);
      if (!v) continue;
      vec = v, veclen = n;
    }
    if (mincore(maps[i].base, maps[i].size, vec) != 0) continue;
    for (size_t k = 0; k < n; k++)
      if (!(vec[k] & 1)) total += (uint64_t)page;
  }
  pthread_mutex_unlock(&maps_mu);
  free(vec);
  return total;
}

/* The bytes of this process's mapped segments: at most what they may still take (shm_unbacked_bytes), without a look
 * at each one's pages. */
static uint64_t shm_mapped_bytes(void) {
  uint64_t total = 0;
  pthread_mutex_lock(&maps_mu);
  for (int i = 0; i < nmaps; i++) total += maps[i].size;
  pthread_mutex_unlock(&maps_mu);
  return total;
}

int shm_create_map(const char* name, size_t size, void (*init)(void* base, void* arg), void* arg, void** base) {
  char tmpname[128], tmppath[256], path[256];
  struct proc_id me;
  proc_self(&me);
  uint64_t r = 0;
  random_bytes(&r, sizeof r);
  snprintf(tmpname, sizeof tmpname, "%s-tmp-%d-%llu-%016llx", shm_prefix(), me.pid, (unsigned long long)me.start,
           (unsigned long long)r);
  path_of(tmppath, sizeof tmppath, tmpname);
  path_of(path, sizeof path, name);
  int fd = open(tmppath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  int err = 0;
  void* p = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) != 0) {
    err = errno;
    goto fail;
  }
  /* Where room is short -- less than RESERVE_FACTOR segments' worth free, as in a container's 64 MiB /dev/shm -- the
   * pages now, not at their first touch: too little room is ENOSPC here instead of a SIGBUS in whichever rank first
   * writes past the room there was. Where there is plenty, at first touch: taking 10 MiB of pages costs about 0.7
   * ms, which a shrink's new communicator would add to a recovery of 5. The room is what is free less what this
   * process's segments may still take: each created sparse saw plenty free, and many (a job's splits) together
   * promised more than there was -- a SIGBUS where a rank wrote past it, no message. A reservation may not take that
   * room either: then too little room is ENOSPC for this one, not for them. */
  struct statvfs fs;
  uint64_t room = fstatvfs(fd, &fs) == 0 ? (uint64_t)fs.f_bavail * fs.f_frsize : 0;
  /* where there is plenty even if no page of theirs were backed, that bound decides alike: mincore over every
   * segment mapped made each new one cost time linear in how many there were (8 ms a split at 1000) */
  uint64_t promised = shm_mapped_bytes();
  if (room <= promised || (room - promised) / RESERVE_FACTOR < (uint64_t)size) promised = shm_unbacked_bytes();
  room = room > promised ? room - promised : 0;
  if (room < (uint64_t)size) {
    err = ENOSPC;
    goto fail;
  }
  int populate = 0;
  if (room / RESERVE_FACTOR < (uint64_t)size) {
    do err = posix_fallocate(fd, 0, (off_t)size); /* a signal interrupts a large one: go on */
    while (err == EINTR);
    if (err == EOPNOTSUPP || err == EINVAL) err = 0; /* a filesystem that cannot: pages at first touch, as before */
    if (err) goto fail;
    populate = MAP_POPULATE; /* reserved pages count as backed (mincore) in every process only once faulted in */
  }
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | populate, fd, 0);
  if (p == MAP_FAILED) {
    err = errno;
    goto fail;
  }
  init(p, arg);
  if (link(tmppath, path) != 0) {
    err = errno;
    goto fail;
  }
  unlink(tmppath);
  close(fd);
  *base = p;
  return 0;
fail:
  if (p != MAP_FAILED) munmap(p, size);
  unlink(tmppath);
  close(fd);
  return err ? err : EIO;
}

void shm_unlink_name(const char* name) {
  char path[256];
  path_of(path, sizeof path, name);
  unlink(path);
}

/* Removes the segment `entry` where its creator is dead or, with `mine` set, is this process. */
int shm_creator_of(const char* name, struct proc_id* creator) {
  char path[300];
  path_of(path, sizeof path, name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  void* p = MAP_FAILED;
  size_t len = 0;
  if (fstat(fd, &st) == 0 && st.st_size >= 4096) { /* the header: its first page, read only */
    len = 4096;
    p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (p == MAP_FAILED) return -1;
  int ok = seg_creator_of(p, len, creator);
  munmap(p, len);
  return ok;
}

static void sweep_one(const char* entry, const struct proc_id* mine) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", SHM_DIR, entry);
  struct proc_id creator = {0};
  const char* rest = entry + strlen(shm_prefix()) + 1; /* past "<prefix>-" (sweep_dir) */
  if (!strncmp(rest, "tmp-", 4)) {
    unsigned long long start = 0;
    if (sscanf(rest + 4, "%d-%llu", &creator.pid, &start) != 2) return;
    creator.start = start;
    struct proc_id me;
    proc_self(&me);
    creator.pidns = me.pidns;
  } else if (shm_creator_of(entry, &creator) != 0) {
    return;
  }
  if (mine ? creator.pid == mine->pid && creator.start == mine->start && creator.pidns == mine->pidns
           : proc_alive(&creator) == 0)
    unlink(path);
}

static void sweep_dir(const struct proc_id* mine) {
  DIR* d = opendir(SHM_DIR);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(shm_prefix()); /* this prefix's own: "pycoll-" is not "pycoll_a-" */
    if (strncmp(e->d_name, shm_prefix(), n) != 0 || e->d_name[n] != '-') continue;
    sweep_one(e->d_name, mine);
  }
  closedir(d);
}

/* As the process ends: the segments it created go now, as the next sweep of another process would remove them
 * once it is dead -- an init never finished (abandoned, or in a thread the exit did not wait for) left its
 * rendezvous segment until some pycoll process on this host made a communicator. Mappings stay valid; a killed
 * process runs no destructor, and the sweeps remove its segments. */
__attribute__((destructor)) static void sweep_own_at_exit(void) {
  struct proc_id me;
  proc_self(&me);
  sweep_dir(&me);
}

void shm_sweep(void) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t last;
  uint64_t t = now_ns();
  pthread_mutex_lock(&mu);
  if (last && t - last < 50000000ull) { /* at most every 50 ms */
    pthread_mutex_unlock(&mu);
    return;
  }
  last = t;
  pthread_mutex_unlock(&mu);
  sweep_dir(NULL);
}
