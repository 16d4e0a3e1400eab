/*
 * gsrun_spank.c -- a SPANK plugin whose logic is Python.
 *
 * Small and boring on purpose: this file parses the plugstack arguments,
 * checks the Slurm version, starts CPython once per process, registers the
 * options that Python's register_options() returns, and forwards every SPANK
 * callback to the Python function of the same name in gsrun.spank_py.hooks.
 * Python sees Slurm through a tiny built-in module, _spank.
 *
 * Rules kept here:
 *  - a Python exception never escapes: it becomes slurm_error lines
 *    ("gsrun: spank: <hook>: ..." + traceback) and the configured return code;
 *  - the interpreter never installs signal handlers, never reads PYTHON*
 *    variables of the calling environment (isolated config), never exits the
 *    process (no PyErr_Print: SystemExit is reported like any exception) and
 *    is never finalized;
 *  - slurmd itself (S_CTX_SLURMD) never starts Python: nothing runs there.
 *  - every message has the shape of gsrun.base.errors: "gsrun: spank:
 *    <what>: <detail>", and a fix the admin can make on its own line
 *    "hint: ...".
 *
 * Build-time constants (set by spank_py/build.py with -D):
 *  GSRUN_LIBPYTHON          soname of libpython, re-opened RTLD_GLOBAL so that
 *                           Python's own extension modules find its symbols
 *  GSRUN_PYTHON_HOME        sys.base_prefix of the Python built against
 *  GSRUN_PYTHON_EXE         that Python's executable (sys.executable)
 *  GSRUN_DEFAULT_PYTHONPATH its site-packages, used when no pythonpath= is given
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <slurm/spank.h>

#ifndef GSRUN_LIBPYTHON
#error "GSRUN_LIBPYTHON must be defined (spank_py/build.py does it)"
#endif
#ifndef GSRUN_PYTHON_HOME
#error "GSRUN_PYTHON_HOME must be defined (spank_py/build.py does it)"
#endif
#ifndef GSRUN_PYTHON_EXE
#define GSRUN_PYTHON_EXE ""
#endif
#ifndef GSRUN_DEFAULT_PYTHONPATH
#define GSRUN_DEFAULT_PYTHONPATH ""
#endif

SPANK_PLUGIN(gsrun, 1);

#define STR_(x) #x
#define STR(x) STR_(x)
#define BUILT_MAJOR SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER)
#define BUILT_MINOR SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER)

/* Found by `strings gsrun_spank.so | grep built-for`. */
__attribute__((used)) static const char gsrun_built_for[] =
	"gsrun_spank built-for slurm=" STR(SLURM_VERSION_NUMBER)
	" python=" PY_VERSION " libpython=" GSRUN_LIBPYTHON;

#define HOOKS_MODULE "gsrun.spank_py.hooks"
#define MAX_PYPATH 8
#define MAX_OPTS 32
#define MAX_ARG_LEN 4096
#define ALLOWED_KEYS "allowed keys: pythonpath=, on_error=, bind=, config="

/* ---------------------------------------------------------------- config */

enum on_error { ON_ERROR_DEFAULT = 0, ON_ERROR_FAIL, ON_ERROR_IGNORE };

struct gs_config {
	const char *pythonpath[MAX_PYPATH];
	int n_pythonpath;
	enum on_error on_error;
	const char *bind; /* "auto" (default) or "none" */
	const char *config; /* site config path (absolute) or NULL: $GSRUN_CONFIG / default */
};

static struct gs_config cfg;

/*
 * Strict plugstack argument parser: key=value only, known keys only.
 * Returns 0 or -1 after logging why.
 */
static int parse_args(int ac, char **av, struct gs_config *c)
{
	memset(c, 0, sizeof(*c));
	c->bind = "auto";
	for (int i = 0; i < ac; i++) {
		const char *a = av[i];
		const char *eq = strchr(a, '=');
		if (eq == NULL || eq == a) {
			slurm_error("gsrun: spank: config: plugstack argument '%s' is not key=value", a);
			slurm_error("hint: " ALLOWED_KEYS);
			return -1;
		}
		size_t klen = (size_t)(eq - a);
		const char *v = eq + 1;
		if (strlen(v) >= MAX_ARG_LEN) {
			slurm_error("gsrun: spank: config: plugstack argument '%.*s' is too long", (int)klen, a);
			slurm_error("hint: a value has at most %d characters", MAX_ARG_LEN - 1);
			return -1;
		}
		if (klen == 10 && strncmp(a, "pythonpath", klen) == 0) {
			if (v[0] != '/' || strchr(v, ':') != NULL) {
				slurm_error("gsrun: spank: config: pythonpath=%s: must be one absolute directory", v);
				slurm_error("hint: repeat pythonpath= for more directories");
				return -1;
			}
			if (c->n_pythonpath >= MAX_PYPATH) {
				slurm_error("gsrun: spank: config: more than %d pythonpath= arguments", MAX_PYPATH);
				return -1;
			}
			c->pythonpath[c->n_pythonpath++] = v;
		} else if (klen == 8 && strncmp(a, "on_error", klen) == 0) {
			if (strcmp(v, "fail") == 0)
				c->on_error = ON_ERROR_FAIL;
			else if (strcmp(v, "ignore") == 0)
				c->on_error = ON_ERROR_IGNORE;
			else {
				slurm_error("gsrun: spank: config: on_error=%s: must be fail or ignore", v);
				return -1;
			}
		} else if (klen == 6 && strncmp(a, "config", klen) == 0) {
			if (v[0] != '/') {
				slurm_error("gsrun: spank: config: config=%s: must be an absolute path", v);
				return -1;
			}
			c->config = v;
		} else if (klen == 4 && strncmp(a, "bind", klen) == 0) {
			if (strcmp(v, "auto") == 0)
				c->bind = "auto";
			else if (strcmp(v, "none") == 0)
				c->bind = "none";
			else {
				slurm_error("gsrun: spank: config: bind=%s: must be auto or none", v);
				return -1;
			}
		} else {
			slurm_error("gsrun: spank: config: unknown plugstack argument '%.*s'", (int)klen, a);
			slurm_error("hint: " ALLOWED_KEYS);
			return -1;
		}
	}
	if (c->n_pythonpath == 0 && GSRUN_DEFAULT_PYTHONPATH[0] != '\0')
		c->pythonpath[c->n_pythonpath++] = GSRUN_DEFAULT_PYTHONPATH;
	return 0;
}

static const char *context_name(spank_context_t ctx)
{
	switch (ctx) {
	case S_CTX_LOCAL: return "local";
	case S_CTX_REMOTE: return "remote";
	case S_CTX_ALLOCATOR: return "allocator";
	case S_CTX_SLURMD: return "slurmd";
	case S_CTX_JOB_SCRIPT: return "job_script";
	default: return "error";
	}
}

/* Return code of a failed hook: on_error= if set, else fail where the user
 * is still at the command line (allocator, local), ignore in running jobs. */
static int error_rc(void)
{
	if (cfg.on_error == ON_ERROR_FAIL)
		return -1;
	if (cfg.on_error == ON_ERROR_IGNORE)
		return 0;
	spank_context_t ctx = spank_context();
	return (ctx == S_CTX_ALLOCATOR || ctx == S_CTX_LOCAL) ? -1 : 0;
}

/* --------------------------------------------------------------- options */

static struct spank_option opts[MAX_OPTS];
static int n_opts;
static char *opt_value[MAX_OPTS]; /* value seen by the option callback */
static int opt_seen[MAX_OPTS];

static int opt_cb(int val, const char *optarg, int remote)
{
	(void)remote;
	if (val < 0 || val >= n_opts)
		return -1;
	free(opt_value[val]);
	opt_value[val] = strdup(optarg ? optarg : "");
	if (opt_value[val] == NULL)
		return -1;
	opt_seen[val] = 1;
	return 0;
}

static int opt_name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > SPANK_OPTION_MAXLEN)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-'))
			return 0;
	}
	return 1;
}

/* ------------------------------------------------------------ _spank module */

static spank_t cur_sp; /* the handle of the callback in progress, else NULL */
static PyObject *SpankError;

static int need_handle(void)
{
	if (cur_sp == NULL) {
		PyErr_SetString(SpankError, "no SPANK callback in progress");
		return -1;
	}
	return 0;
}

static PyObject *spank_fail(const char *what, spank_err_t rc)
{
	PyObject *v = Py_BuildValue("(is)", (int)rc, spank_strerror(rc));
	if (v) {
		PyObject *e = PyObject_Call(SpankError, v, NULL);
		Py_DECREF(v);
		if (e) {
			PyObject *w = PyUnicode_FromString(what);
			if (w) {
				PyObject_SetAttrString(e, "what", w);
				Py_DECREF(w);
			}
			PyErr_SetObject(SpankError, e);
			Py_DECREF(e);
		}
	}
	return NULL;
}

static PyObject *py_context(PyObject *self, PyObject *noargs)
{
	(void)self; (void)noargs;
	return PyUnicode_FromString(context_name(spank_context()));
}

static PyObject *py_log(PyObject *self, PyObject *args)
{
	const char *level, *msg;
	(void)self;
	if (!PyArg_ParseTuple(args, "ss:log", &level, &msg))
		return NULL;
	if (strcmp(level, "error") == 0)
		slurm_error("%s", msg);
	else if (strcmp(level, "info") == 0)
		slurm_info("%s", msg);
	else if (strcmp(level, "verbose") == 0)
		slurm_verbose("%s", msg);
	else if (strcmp(level, "debug") == 0)
		slurm_debug("%s", msg);
	else if (strcmp(level, "debug2") == 0)
		slurm_debug2("%s", msg);
	else if (strcmp(level, "user") == 0)
		slurm_spank_log("%s", msg);
	else {
		PyErr_Format(PyExc_ValueError, "log level %s: must be error, info, verbose, debug, debug2 or user", level);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *py_getenv(PyObject *self, PyObject *args)
{
	const char *name;
	(void)self;
	if (!PyArg_ParseTuple(args, "s:getenv", &name) || need_handle() < 0)
		return NULL;
	for (int len = 4096; len <= (1 << 20); len *= 4) {
		char *buf = malloc((size_t)len);
		if (!buf)
			return PyErr_NoMemory();
		spank_err_t rc = spank_getenv(cur_sp, name, buf, len);
		if (rc == ESPANK_SUCCESS) {
			PyObject *r = PyUnicode_DecodeFSDefault(buf);
			free(buf);
			return r;
		}
		free(buf);
		if (rc == ESPANK_ENV_NOEXIST)
			Py_RETURN_NONE;
		if (rc != ESPANK_NOSPACE)
			return spank_fail("getenv", rc);
	}
	return spank_fail("getenv", ESPANK_NOSPACE);
}

static PyObject *py_setenv(PyObject *self, PyObject *args)
{
	const char *name, *value;
	int overwrite = 1;
	(void)self;
	if (!PyArg_ParseTuple(args, "ss|p:setenv", &name, &value, &overwrite) || need_handle() < 0)
		return NULL;
	spank_err_t rc = spank_setenv(cur_sp, name, value, overwrite);
	if (rc != ESPANK_SUCCESS)
		return spank_fail("setenv", rc);
	Py_RETURN_NONE;
}

static PyObject *py_unsetenv(PyObject *self, PyObject *args)
{
	const char *name;
	(void)self;
	if (!PyArg_ParseTuple(args, "s:unsetenv", &name) || need_handle() < 0)
		return NULL;
	spank_err_t rc = spank_unsetenv(cur_sp, name);
	if (rc != ESPANK_SUCCESS)
		return spank_fail("unsetenv", rc);
	Py_RETURN_NONE;
}

static PyObject *py_job_control_setenv(PyObject *self, PyObject *args)
{
	const char *name, *value;
	int overwrite = 1;
	(void)self;
	if (!PyArg_ParseTuple(args, "ss|p:job_control_setenv", &name, &value, &overwrite) || need_handle() < 0)
		return NULL;
	spank_err_t rc = spank_job_control_setenv(cur_sp, name, value, overwrite);
	if (rc != ESPANK_SUCCESS)
		return spank_fail("job_control_setenv", rc);
	Py_RETURN_NONE;
}

enum item_kind { K_U32, K_U16, K_INT, K_UID, K_GID, K_PID, K_U64, K_STR, K_GIDS, K_ENV, K_ARGV };

static const struct { const char *name; spank_item_t item; enum item_kind kind; } items[] = {
	{ "S_JOB_UID", S_JOB_UID, K_UID },
	{ "S_JOB_GID", S_JOB_GID, K_GID },
	{ "S_JOB_ID", S_JOB_ID, K_U32 },
	{ "S_JOB_STEPID", S_JOB_STEPID, K_U32 },
	{ "S_JOB_NNODES", S_JOB_NNODES, K_U32 },
	{ "S_JOB_NODEID", S_JOB_NODEID, K_U32 },
	{ "S_JOB_LOCAL_TASK_COUNT", S_JOB_LOCAL_TASK_COUNT, K_U32 },
	{ "S_JOB_TOTAL_TASK_COUNT", S_JOB_TOTAL_TASK_COUNT, K_U32 },
	{ "S_JOB_NCPUS", S_JOB_NCPUS, K_U16 },
	{ "S_JOB_ARGV", S_JOB_ARGV, K_ARGV },
	{ "S_JOB_ENV", S_JOB_ENV, K_ENV },
	{ "S_TASK_ID", S_TASK_ID, K_INT },
	{ "S_TASK_GLOBAL_ID", S_TASK_GLOBAL_ID, K_U32 },
	{ "S_TASK_EXIT_STATUS", S_TASK_EXIT_STATUS, K_INT },
	{ "S_TASK_PID", S_TASK_PID, K_PID },
	{ "S_JOB_SUPPLEMENTARY_GIDS", S_JOB_SUPPLEMENTARY_GIDS, K_GIDS },
	{ "S_SLURM_VERSION", S_SLURM_VERSION, K_STR },
	{ "S_SLURM_VERSION_MAJOR", S_SLURM_VERSION_MAJOR, K_STR },
	{ "S_SLURM_VERSION_MINOR", S_SLURM_VERSION_MINOR, K_STR },
	{ "S_SLURM_VERSION_MICRO", S_SLURM_VERSION_MICRO, K_STR },
	{ "S_STEP_CPUS_PER_TASK", S_STEP_CPUS_PER_TASK, K_U32 },
	{ "S_JOB_ALLOC_CORES", S_JOB_ALLOC_CORES, K_STR },
	{ "S_JOB_ALLOC_MEM", S_JOB_ALLOC_MEM, K_U64 },
	{ "S_STEP_ALLOC_CORES", S_STEP_ALLOC_CORES, K_STR },
	{ "S_STEP_ALLOC_MEM", S_STEP_ALLOC_MEM, K_U64 },
};

/* get_item(name) -> int | str | list | dict, or None when Slurm says the item
 * is not available here (wrong context, no task, ...). */
static PyObject *py_get_item(PyObject *self, PyObject *args)
{
	const char *name;
	(void)self;
	if (!PyArg_ParseTuple(args, "s:get_item", &name) || need_handle() < 0)
		return NULL;
	size_t i, n = sizeof(items) / sizeof(items[0]);
	for (i = 0; i < n; i++)
		if (strcmp(items[i].name, name) == 0)
			break;
	if (i == n) {
		PyErr_Format(PyExc_ValueError, "get_item: unknown item %s", name);
		return NULL;
	}
	spank_err_t rc;
	/* Zeroed and larger than any scalar the header declares. */
	union { uint16_t u16; uint32_t u32; uint64_t u64; int i; uid_t uid; gid_t gid; pid_t pid;
		char *s; char **env; unsigned char pad[16]; } v;
	memset(&v, 0, sizeof(v));
	switch (items[i].kind) {
	case K_GIDS: {
		gid_t *gids = NULL;
		int ngids = 0;
		rc = spank_get_item(cur_sp, items[i].item, &gids, &ngids);
		if (rc != ESPANK_SUCCESS)
			Py_RETURN_NONE;
		PyObject *l = PyList_New(0);
		for (int k = 0; l && k < ngids; k++) {
			PyObject *x = PyLong_FromUnsignedLong(gids[k]);
			if (!x || PyList_Append(l, x) < 0) {
				Py_XDECREF(x);
				Py_CLEAR(l);
				break;
			}
			Py_DECREF(x);
		}
		return l;
	}
	case K_ARGV: {
		int argc = 0;
		char **argv = NULL;
		rc = spank_get_item(cur_sp, items[i].item, &argc, &argv);
		if (rc != ESPANK_SUCCESS)
			Py_RETURN_NONE;
		PyObject *l = PyList_New(0);
		for (int k = 0; l && k < argc && argv && argv[k]; k++) {
			PyObject *x = PyUnicode_DecodeFSDefault(argv[k]);
			if (!x || PyList_Append(l, x) < 0) {
				Py_XDECREF(x);
				Py_CLEAR(l);
				break;
			}
			Py_DECREF(x);
		}
		return l;
	}
	default:
		rc = spank_get_item(cur_sp, items[i].item, &v);
	}
	if (rc != ESPANK_SUCCESS)
		Py_RETURN_NONE;
	switch (items[i].kind) {
	case K_U32: return PyLong_FromUnsignedLong(v.u32);
	case K_U16: return PyLong_FromUnsignedLong(v.u16);
	case K_INT: return PyLong_FromLong(v.i);
	case K_UID: return PyLong_FromUnsignedLong(v.uid);
	case K_GID: return PyLong_FromUnsignedLong(v.gid);
	case K_PID: return PyLong_FromLong(v.pid);
	case K_U64: return PyLong_FromUnsignedLongLong(v.u64);
	case K_STR:
		if (v.s == NULL)
			Py_RETURN_NONE;
		return PyUnicode_DecodeFSDefault(v.s);
	case K_ENV: {
		PyObject *d = PyDict_New();
		for (char **e = v.env; d && e && *e; e++) {
			const char *eq = strchr(*e, '=');
			if (!eq)
				continue;
			PyObject *k = PyUnicode_DecodeFSDefaultAndSize(*e, eq - *e);
			PyObject *x = PyUnicode_DecodeFSDefault(eq + 1);
			if (!k || !x || PyDict_SetItem(d, k, x) < 0)
				Py_CLEAR(d);
			Py_XDECREF(k);
			Py_XDECREF(x);
		}
		return d;
	}
	default:
		Py_RETURN_NONE;
	}
}

/* option_getopt(name) -> str ("" for a flag or an omitted optional value) or
 * None when the option was not given. */
static PyObject *py_option_getopt(PyObject *self, PyObject *args)
{
	const char *name;
	(void)self;
	if (!PyArg_ParseTuple(args, "s:option_getopt", &name))
		return NULL;
	for (int i = 0; i < n_opts; i++) {
		if (strcmp(opts[i].name, name) != 0)
			continue;
		if (opt_seen[i])
			return PyUnicode_FromString(opt_value[i]);
		if (cur_sp == NULL)
			Py_RETURN_NONE;
		char *optarg = NULL;
		spank_err_t rc = spank_option_getopt(cur_sp, &opts[i], &optarg);
		if (rc != ESPANK_SUCCESS)
			Py_RETURN_NONE;
		return PyUnicode_FromString(optarg ? optarg : "");
	}
	PyErr_Format(PyExc_KeyError, "option_getopt: %s is not a registered option", name);
	return NULL;
}

/* set_mempolicy(mode, nodes) for the calling process (task_init runs in the
 * task itself, before exec). mode: 0 default, 1 preferred, 2 bind, 3 interleave. */
static PyObject *py_set_mempolicy(PyObject *self, PyObject *args)
{
	int mode;
	PyObject *nodes;
	unsigned long mask[1024 / (8 * sizeof(unsigned long))];
	(void)self;
	if (!PyArg_ParseTuple(args, "iO:set_mempolicy", &mode, &nodes))
		return NULL;
	if (mode < 0 || mode > 3) {
		PyErr_Format(PyExc_ValueError, "set_mempolicy: mode %d not in 0-3", mode);
		return NULL;
	}
	memset(mask, 0, sizeof(mask));
	PyObject *it = PyObject_GetIter(nodes);
	if (!it)
		return NULL;
	PyObject *x;
	while ((x = PyIter_Next(it)) != NULL) {
		long nd = PyLong_AsLong(x);
		Py_DECREF(x);
		if (nd == -1 && PyErr_Occurred())
			break;
		if (nd < 0 || nd >= 1024) {
			PyErr_Format(PyExc_ValueError, "set_mempolicy: node %ld not in 0-1023", nd);
			break;
		}
		mask[nd / (8 * sizeof(unsigned long))] |= 1UL << (nd % (8 * sizeof(unsigned long)));
	}
	Py_DECREF(it);
	if (PyErr_Occurred())
		return NULL;
	long r = syscall(SYS_set_mempolicy, mode, mode == 0 ? NULL : mask,
			 mode == 0 ? 0UL : (unsigned long)(8 * sizeof(mask)) + 1);
	if (r != 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	Py_RETURN_NONE;
}

static PyMethodDef spank_methods[] = {
	{ "context", py_context, METH_NOARGS, "context() -> 'local'|'remote'|'allocator'|'slurmd'|'job_script'" },
	{ "log", py_log, METH_VARARGS, "log(level, msg): level error|info|verbose|debug|debug2|user" },
	{ "getenv", py_getenv, METH_VARARGS, "getenv(name) -> str | None (job env, remote only)" },
	{ "setenv", py_setenv, METH_VARARGS, "setenv(name, value, overwrite=True) (job/task env, remote only)" },
	{ "unsetenv", py_unsetenv, METH_VARARGS, "unsetenv(name) (remote only)" },
	{ "job_control_setenv", py_job_control_setenv, METH_VARARGS,
	  "job_control_setenv(name, value, overwrite=True): prolog/epilog see SPANK_<name> (allocator/local only)" },
	{ "get_item", py_get_item, METH_VARARGS, "get_item('S_JOB_ID') -> value or None" },
	{ "option_getopt", py_option_getopt, METH_VARARGS, "option_getopt(name) -> str | None" },
	{ "set_mempolicy", py_set_mempolicy, METH_VARARGS, "set_mempolicy(mode, nodes)" },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef spank_module = {
	PyModuleDef_HEAD_INIT, "_spank", "Slurm SPANK calls for gsrun's hooks (exists only inside the plugin).",
	-1, spank_methods, NULL, NULL, NULL, NULL
};

static PyObject *PyInit__spank(void)
{
	PyObject *m = PyModule_Create(&spank_module);
	if (!m)
		return NULL;
	SpankError = PyErr_NewExceptionWithDoc("_spank.SpankError",
		"A SPANK call failed: args are (spank error code, spank_strerror text); .what names the call.",
		PyExc_OSError, NULL);
	if (!SpankError || PyModule_AddObject(m, "SpankError", SpankError) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	Py_INCREF(SpankError); /* keep our own reference */
	PyModule_AddIntConstant(m, "SLURM_VERSION_NUMBER", SLURM_VERSION_NUMBER);
	return m;
}

/* ------------------------------------------------------------ interpreter */

static int py_state;     /* 0 not tried, 1 running, -1 failed (not retried) */
static pid_t py_pid;     /* process that owns the interpreter state */
static PyThreadState *py_main_ts;
static PyObject *hooks;  /* gsrun.spank_py.hooks */
static PyObject *py_args; /* dict handed to every hook */

/* Report the pending Python exception as slurm_error lines. GIL held. */
static void report_exception(const char *hook)
{
	PyObject *type = NULL, *value = NULL, *tb = NULL;
#if PY_VERSION_HEX >= 0x030C0000
	value = PyErr_GetRaisedException();
	if (value)
		type = Py_NewRef((PyObject *)Py_TYPE(value));
#else
	PyErr_Fetch(&type, &value, &tb);
	PyErr_NormalizeException(&type, &value, &tb);
	if (value && tb)
		PyException_SetTraceback(value, tb);
#endif
	int done = 0;
	if (value) {
		PyObject *s = PyObject_Str(value);
		const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
		/* A GsrunError is "gsrun: ...\nhint: ...": one log line each,
		 * the hint line as Python prints it. */
		const char *nl = txt ? strchr(txt, '\n') : NULL;
		slurm_error("gsrun: spank: %s: %s: %.*s", hook,
			    type ? ((PyTypeObject *)type)->tp_name : "?",
			    nl ? (int)(nl - txt) : (txt ? (int)strlen(txt) : 1), txt ? txt : "?");
		while (nl) {
			const char *line = nl + 1;
			nl = strchr(line, '\n');
			if (nl ? nl > line : *line != '\0')
				slurm_error("%.*s", nl ? (int)(nl - line) : (int)strlen(line), line);
		}
		Py_XDECREF(s);
		PyErr_Clear();
		PyObject *tbmod = PyImport_ImportModule("traceback");
		PyObject *lines = tbmod ? PyObject_CallMethod(tbmod, "format_exception", "O", value) : NULL;
		if (lines && PyList_Check(lines)) {
			PyObject *joined = PyUnicode_Join(NULL, lines);
			PyObject *split = joined ? PyUnicode_Splitlines(joined, 0) : NULL;
			for (Py_ssize_t k = 0; split && k < PyList_GET_SIZE(split); k++) {
				const char *ln = PyUnicode_AsUTF8(PyList_GET_ITEM(split, k));
				if (ln)
					slurm_error("gsrun: spank: %s: %s", hook, ln);
			}
			Py_XDECREF(split);
			Py_XDECREF(joined);
			done = 1;
		}
		Py_XDECREF(lines);
		Py_XDECREF(tbmod);
		PyErr_Clear();
	}
	if (!done && !value)
		slurm_error("gsrun: spank: %s: failed without a Python exception", hook);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
}

static PyObject *build_args_dict(void)
{
	PyObject *d = PyDict_New(), *l = PyList_New(0);
	if (!d || !l)
		goto fail;
	for (int i = 0; i < cfg.n_pythonpath; i++) {
		PyObject *s = PyUnicode_DecodeFSDefault(cfg.pythonpath[i]);
		if (!s || PyList_Append(l, s) < 0) {
			Py_XDECREF(s);
			goto fail;
		}
		Py_DECREF(s);
	}
	const char *oe = cfg.on_error == ON_ERROR_FAIL ? "fail" : cfg.on_error == ON_ERROR_IGNORE ? "ignore" : NULL;
	PyObject *oev = oe ? PyUnicode_FromString(oe) : Py_NewRef(Py_None);
	PyObject *bv = PyUnicode_FromString(cfg.bind);
	PyObject *cv = cfg.config ? PyUnicode_DecodeFSDefault(cfg.config) : Py_NewRef(Py_None);
	int bad = !oev || !bv || !cv || PyDict_SetItemString(d, "pythonpath", l) < 0 ||
		  PyDict_SetItemString(d, "on_error", oev) < 0 || PyDict_SetItemString(d, "bind", bv) < 0 ||
		  PyDict_SetItemString(d, "config", cv) < 0;
	Py_XDECREF(oev);
	Py_XDECREF(bv);
	Py_XDECREF(cv);
	Py_DECREF(l);
	if (bad) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
fail:
	Py_XDECREF(d);
	Py_XDECREF(l);
	return NULL;
}

/* Start the interpreter and import the hooks, once per process. Returns 0 with
 * the interpreter ready (GIL not held) or -1 after logging why. */
static int py_start(void)
{
	if (py_state != 0)
		return py_state > 0 ? 0 : -1;
	py_state = -1;

	/* Extension modules of Python (lib-dynload) are not linked to libpython:
	 * they need its symbols global, but Slurm dlopen()s us RTLD_LOCAL. */
	if (dlopen(GSRUN_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL)
		slurm_verbose("gsrun: spank: python: cannot re-open %s RTLD_GLOBAL: %s",
			      GSRUN_LIBPYTHON, dlerror());

	if (Py_IsInitialized()) {
		slurm_error("gsrun: spank: python: interpreter in use: another plugin of this process "
			    "already started Python");
		slurm_error("hint: gsrun_spank needs its own interpreter; load no other Python-embedding "
			    "plugin in plugstack.conf");
		return -1;
	}
	if (PyImport_AppendInittab("_spank", PyInit__spank) < 0) {
		slurm_error("gsrun: spank: python: cannot register the _spank module");
		return -1;
	}

	PyStatus st;
	PyConfig pc;
	PyConfig_InitIsolatedConfig(&pc);      /* no PYTHON* env, no user site, no cwd */
	pc.install_signal_handlers = 0;        /* as Py_InitializeEx(0) */
	pc.site_import = 0;                    /* our pythonpath= only, no dist-packages */
	pc.write_bytecode = 0;                 /* root never writes .pyc into the venv */
	pc.parse_argv = 0;
	st = PyConfig_SetBytesString(&pc, &pc.home, GSRUN_PYTHON_HOME);
	if (!PyStatus_Exception(st) && GSRUN_PYTHON_EXE[0] != '\0')
		st = PyConfig_SetBytesString(&pc, &pc.program_name, GSRUN_PYTHON_EXE);
	if (!PyStatus_Exception(st))
		st = Py_InitializeFromConfig(&pc);
	PyConfig_Clear(&pc);
	if (PyStatus_Exception(st)) {
		slurm_error("gsrun: spank: python: cannot start Python (home %s): %s%s%s",
			    GSRUN_PYTHON_HOME, st.func ? st.func : "", st.func ? ": " : "",
			    st.err_msg ? st.err_msg : "unknown error");
		slurm_error("hint: rebuild and reinstall the plugin for the Python gsrun is installed in: "
			    "gsrun-node spank build && gsrun-node spank install");
		return -1;
	}
	py_pid = getpid();

	int ok = 0;
	PyObject *sys_path = PySys_GetObject("path"); /* borrowed */
	PyObject *site = PyImport_ImportModule("site");
	if (sys_path && site) {
		ok = 1;
		for (int i = cfg.n_pythonpath - 1; ok && i >= 0; i--) {
			PyObject *p = PyUnicode_DecodeFSDefault(cfg.pythonpath[i]);
			ok = p && PyList_Insert(sys_path, 0, p) == 0;
			Py_XDECREF(p);
		}
		/* .pth files (an editable install of gsrun uses one). */
		for (int i = 0; ok && i < cfg.n_pythonpath; i++) {
			PyObject *p = PyUnicode_DecodeFSDefault(cfg.pythonpath[i]);
			PyObject *r = p ? PyObject_CallMethod(site, "addsitedir", "O", p) : NULL;
			ok = r != NULL;
			Py_XDECREF(r);
			Py_XDECREF(p);
		}
	}
	Py_XDECREF(site);
	if (ok) {
		py_args = build_args_dict();
		ok = py_args != NULL;
	}
	if (ok) {
		hooks = PyImport_ImportModule(HOOKS_MODULE);
		ok = hooks != NULL;
	}
	if (!ok) {
		slurm_error("gsrun: spank: python: cannot import " HOOKS_MODULE
			    " (pythonpath=%s%s)", cfg.n_pythonpath ? cfg.pythonpath[0] : "<none>",
			    cfg.n_pythonpath > 1 ? ",..." : "");
		report_exception("import");
		slurm_error("hint: install gsrun into the Python this plugin was built "
			    "for and point pythonpath= at its site-packages");
	}
	py_main_ts = PyEval_SaveThread();
	if (!ok)
		return -1;
	py_state = 1;
	return 0;
}

/* Take the GIL; first repair the interpreter when we are a forked child
 * (slurmstepd forks each task and calls task_init there). */
static PyGILState_STATE py_enter(void)
{
	if (getpid() != py_pid) {
		PyEval_RestoreThread(py_main_ts);
		PyOS_AfterFork_Child();
		py_pid = getpid();
		py_main_ts = PyEval_SaveThread();
	}
	return PyGILState_Ensure();
}

/* Call hooks.<name>(context, args) if it exists. Returns the SPANK rc. GIL held. */
static int call_py(spank_t sp, const char *name)
{
	int rc = 0;
	PyObject *fn = PyObject_GetAttrString(hooks, name);
	if (fn == NULL) {
		if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
			PyErr_Clear();
			return 0;
		}
		report_exception(name);
		return error_rc();
	}
	cur_sp = sp;
	PyObject *r = PyObject_CallFunction(fn, "sO", context_name(spank_context()), py_args);
	cur_sp = NULL;
	Py_DECREF(fn);
	if (r == NULL) {
		report_exception(name);
		return error_rc();
	}
	if (r == Py_None) {
		rc = 0;
	} else if (PyLong_Check(r)) {
		long v = PyLong_AsLong(r);
		if (v == -1 && PyErr_Occurred()) {
			PyErr_Clear();
			v = -1;
		}
		rc = v == 0 ? 0 : -1;
	} else {
		slurm_error("gsrun: spank: %s: returned %s, expected int or None", name, Py_TYPE(r)->tp_name);
		rc = error_rc();
	}
	Py_DECREF(r);
	return rc;
}

static int dispatch(spank_t sp, const char *name)
{
	spank_context_t ctx = spank_context();
	if (ctx == S_CTX_SLURMD || ctx == S_CTX_ERROR)
		return 0;
	if (py_state <= 0)
		return py_state < 0 ? error_rc() : 0;
	PyGILState_STATE g = py_enter();
	int rc = call_py(sp, name);
	PyGILState_Release(g);
	return rc;
}

/* ------------------------------------------------------------ SPANK entry */

static int check_slurm_version(spank_t sp)
{
	char *major = NULL, *minor = NULL, *full = NULL;
	if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS || major == NULL ||
	    spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS || minor == NULL) {
		slurm_verbose("gsrun: spank: version: running Slurm version not available; not checked");
		return 0;
	}
	spank_get_item(sp, S_SLURM_VERSION, &full);
	if (atoi(major) != BUILT_MAJOR || atoi(minor) != BUILT_MINOR) {
		slurm_error("gsrun: spank: version: gsrun_spank.so was built for Slurm %d.%02d but this is "
			    "Slurm %s; refusing to load", BUILT_MAJOR, BUILT_MINOR, full ? full : major);
		slurm_error("hint: rebuild and reinstall it on this Slurm: gsrun-node spank build && "
			    "gsrun-node spank install");
		return -1;
	}
	return 0;
}

static int register_options(spank_t sp)
{
	int rc = 0;
	PyGILState_STATE g = py_enter();
	PyObject *fn = PyObject_GetAttrString(hooks, "register_options");
	if (fn == NULL) {
		PyErr_Clear();
		PyGILState_Release(g);
		return 0;
	}
	cur_sp = sp;
	PyObject *table = PyObject_CallNoArgs(fn);
	cur_sp = NULL;
	Py_DECREF(fn);
	PyObject *seq = table ? PySequence_Fast(table, "register_options() must return a sequence") : NULL;
	if (seq == NULL) {
		report_exception("register_options");
		rc = -1;
		goto out;
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	for (Py_ssize_t i = 0; i < n && n_opts < MAX_OPTS; i++) {
		const char *name, *arginfo, *usage;
		int has_arg;
		PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
		if (!PyTuple_Check(row) || !PyArg_ParseTuple(row, "szsi", &name, &arginfo, &usage, &has_arg)) {
			PyErr_Clear();
			slurm_error("gsrun: spank: register_options: row %zd is not (name, arginfo|None, usage, has_arg)", i);
			rc = -1;
			break;
		}
		if (!opt_name_ok(name) || has_arg < 0 || has_arg > 2) {
			slurm_error("gsrun: spank: register_options: bad option %s (has_arg %d)", name, has_arg);
			rc = -1;
			break;
		}
		struct spank_option *o = &opts[n_opts];
		o->name = strdup(name);
		o->arginfo = arginfo ? strdup(arginfo) : NULL;
		o->usage = strdup(usage);
		o->has_arg = has_arg;
		o->val = n_opts;
		o->cb = opt_cb;
		if (!o->name || !o->usage || (arginfo && !o->arginfo)) {
			slurm_error("gsrun: spank: register_options: out of memory");
			rc = -1;
			break;
		}
		n_opts++;
		spank_err_t e = spank_option_register(sp, o);
		if (e != ESPANK_SUCCESS) {
			slurm_error("gsrun: spank: register_options: --%s: %s", name, spank_strerror(e));
			rc = -1;
			break;
		}
	}
	if (n > MAX_OPTS)
		slurm_error("gsrun: spank: register_options: more than %d options; the rest are ignored", MAX_OPTS);
out:
	Py_XDECREF(seq);
	Py_XDECREF(table);
	PyGILState_Release(g);
	return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	if (parse_args(ac, av, &cfg) < 0)
		return -1;
	if (check_slurm_version(sp) < 0)
		return -1;
	if (ctx == S_CTX_SLURMD || ctx == S_CTX_ERROR)
		return 0; /* nothing of ours runs inside slurmd itself */
	if (py_start() < 0)
		return error_rc();
	if (register_options(sp) < 0)
		return error_rc();
	return dispatch(sp, "slurm_spank_init");
}

#define FORWARD(hook) \
	int hook(spank_t sp, int ac, char **av) \
	{ \
		(void)ac; (void)av; \
		return dispatch(sp, #hook); \
	}

FORWARD(slurm_spank_init_post_opt)
FORWARD(slurm_spank_local_user_init)
FORWARD(slurm_spank_user_init)
FORWARD(slurm_spank_task_init_privileged)
FORWARD(slurm_spank_task_init)
FORWARD(slurm_spank_task_post_fork)
FORWARD(slurm_spank_task_exit)
FORWARD(slurm_spank_job_prolog)
FORWARD(slurm_spank_job_epilog)
FORWARD(slurm_spank_exit)
