/*
 * The client side of the node daemon's protocol (daemon/server.py, "Protocol"),
 * shared by gsrun-hook (daemon/client.c) and the SPANK plugin
 * (spank_py/gsrun_spank.c): connect to a daemon of our own user, build a
 * request (u32 length, then NUL-terminated fields: "GSH1", umask in octal,
 * argc, the arguments, NAME=VALUE environment entries) and send it, with
 * descriptors 0-2 attached when asked.
 *
 * Only the standard C library; static functions, for one translation unit each.
 */
#ifndef GSRUN_DAEMON_CLIENT_H
#define GSRUN_DAEMON_CLIENT_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#define GS_DAEMON_MAX_REQUEST (1u << 20) /* gsrun.daemon.server.MAX_REQUEST_BYTES */

struct gs_msg {
	char *buf; /* 4 bytes of length, then the fields */
	size_t len; /* bytes of fields */
};

/* Append one NUL-terminated field; -1 when the request would pass the limit. */
static int gs_msg_add(struct gs_msg *m, const char *s)
{
	size_t n = strlen(s) + 1;

	if (m->len + n > GS_DAEMON_MAX_REQUEST - 4)
		return -1;
	memcpy(m->buf + 4 + m->len, s, n);
	m->len += n;
	return 0;
}

/* Start a request with argc arguments to follow; -1 when out of memory. */
static int gs_msg_begin(struct gs_msg *m, mode_t um, int argc)
{
	char num[32];

	m->len = 0;
	m->buf = malloc(GS_DAEMON_MAX_REQUEST);
	if (!m->buf)
		return -1;
	snprintf(num, sizeof(num), "%o", (unsigned)um);
	if (gs_msg_add(m, "GSH1") || gs_msg_add(m, num))
		return -1;
	snprintf(num, sizeof(num), "%d", argc);
	return gs_msg_add(m, num);
}

static void gs_msg_free(struct gs_msg *m)
{
	free(m->buf);
	m->buf = NULL;
}

/* Connect to the daemon on path with send/receive timeouts of timeout_s; only
 * a daemon of our own user id (SO_PEERCRED) is talked to. A socket that took
 * one of 0-2 (one was closed) is refused: it would reach the hook as its
 * stdin/stdout/stderr. Returns the descriptor or -1. */
static int gs_daemon_connect(const char *path, int timeout_s)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = timeout_s };
	struct ucred cr;
	socklen_t crl = sizeof(cr);
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (fd < 3) {
		errno = EBADF;      /* one of 0-2 closed */
		goto bad;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto bad;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 || crl != sizeof(cr) ||
	    (cr.uid != geteuid() && cr.uid != 0)) {	/* its own user's daemon, or root's */
		errno = EPERM;
		goto bad;
	}
	return fd;
bad: {
	int saved = errno;

	close(fd);
	errno = saved;
	return -1;
}
}

/* Send the request (its length filled in here), with descriptors 0, 1, 2
 * attached to its first part when with_fds. 0 or -1. */
static int gs_msg_send(int fd, struct gs_msg *m, int with_fds)
{
	char ctl[CMSG_SPACE(3 * sizeof(int))];
	struct iovec iov = { .iov_base = m->buf, .iov_len = m->len + 4 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t off = 0;

	m->buf[0] = (char)(m->len >> 24);
	m->buf[1] = (char)(m->len >> 16);
	m->buf[2] = (char)(m->len >> 8);
	m->buf[3] = (char)m->len;
	if (with_fds) {
		int fds[3] = { 0, 1, 2 };
		struct cmsghdr *c;

		memset(ctl, 0, sizeof(ctl));
		mh.msg_control = ctl;
		mh.msg_controllen = sizeof(ctl);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(fds));
		memcpy(CMSG_DATA(c), fds, sizeof(fds));
	}
	while (off < m->len + 4) {
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;      /* two of 0-2 closed (EBADF) too */
		off += (size_t)w;
		iov.iov_base = m->buf + off;
		iov.iov_len = m->len + 4 - off;
		mh.msg_control = NULL;  /* the descriptors go with the first part only */
		mh.msg_controllen = 0;
	}
	return 0;
}

/* Read exactly n bytes (EINTR retried); -1 on EOF, error or timeout. */
__attribute__((unused)) static int gs_read_full(int fd, char *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

#endif
