/* Runs a command confined as Docker confines a container that is not privileged but has SYS_ADMIN
 * (the evaluator's service in docker-compose.yml): every cgroup file system read-only, as Docker
 * mounts /sys/fs/cgroup in such a container, and mount(2) and its newer relatives refused with
 * EACCES, as AppArmor's `docker-default` profile refuses them (`deny mount`). Capabilities are kept.
 * For tests/evaluator/test_sandbox_confined.py; needs root.
 *
 *     cc -O2 -o confine confine.c && ./confine python3 -c '...'
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Every mount point at or below /sys/fs/cgroup made read-only; returns how many, or -1. */
static int cgroups_read_only(void) {
    FILE *info = fopen("/proc/self/mountinfo", "r");
    char line[4096], point[4096];
    int count = 0;
    if (info == NULL) return -1;
    while (fgets(line, sizeof line, info) != NULL) {
        /* fields: id parent major:minor root mount-point options ... */
        if (sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1) continue;
        if (strncmp(point, "/sys/fs/cgroup", 14) != 0 || (point[14] != '\0' && point[14] != '/')) continue;
        if (mount(NULL, point, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  NULL) != 0) {
            fprintf(stderr, "confine: remount %s read-only: %s\n", point, strerror(errno));
            fclose(info);
            return -1;
        }
        count++;
    }
    fclose(info);
    return count;
}

#define REFUSE(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                   BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA))

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: confine COMMAND [ARG...]\n");
        return 2;
    }
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        perror("confine: a mount namespace of its own");
        return 1;
    }
    if (cgroups_read_only() <= 0) {
        fprintf(stderr, "confine: no cgroup file system made read-only\n");
        return 1;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        REFUSE(__NR_mount),
        REFUSE(__NR_umount2),
        REFUSE(__NR_pivot_root),
        REFUSE(428), /* open_tree */
        REFUSE(429), /* move_mount */
        REFUSE(430), /* fsopen */
        REFUSE(431), /* fsconfig */
        REFUSE(432), /* fsmount */
        REFUSE(442), /* mount_setattr */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        perror("confine: seccomp filter");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("confine: exec");
    return 127;
}
