#!/bin/sh
# gsrun's policy script for irqbalance (irqbalance -l/--policyscript=THIS; see docs/ADMIN.md,
# "irqbalance"). irqbalance runs it once per IRQ it discovers, at its start and at each rescan
# (SIGHUP, CPU hotplug, a new IRQ), as: THIS <sysfs device dir> <irq>; it reads key=value lines
# on stdout and needs exit status 0. Printed: ban=true for
#   - an IRQ of an NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302): the GPUs' IRQs are placed
#     by gsrun's irq=local for the job holding the node, or stay where the kernel put them;
#   - an IRQ named by a file "$GSRUN_IRQ_BAN_DIR/<irq>" (default /run/gsrun/irqbalance-ban).
# Nothing else is printed; any unexpected input leaves the IRQ to irqbalance.
dev=$1
irq=$2
ban_dir=${GSRUN_IRQ_BAN_DIR:-/run/gsrun/irqbalance-ban}
case $irq in
  ''|*[!0-9]*) exit 0 ;;
esac
if [ -e "$ban_dir/$irq" ]; then
  echo ban=true
  exit 0
fi
vendor=
class=
[ -r "$dev/vendor" ] && read -r vendor < "$dev/vendor"
[ -r "$dev/class" ] && read -r class < "$dev/class"
if [ "$vendor" = 0x10de ]; then
  case $class in
    0x0300*|0x0302*) echo ban=true ;;
  esac
fi
exit 0
