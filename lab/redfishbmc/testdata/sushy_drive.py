# Drives a Redfish BMC with sushy, OpenStack Ironic's Redfish client, and
# prints what it read: TestSushyDrivesTheLabBMC compares it.
import os

import sushy
from sushy import auth

user, password = os.environ["BMC_USER"], os.environ["BMC_PASSWORD"]
root = sushy.Sushy(os.environ["BMC_URL"] + "/redfish/v1", verify=False,
                   auth=auth.BasicAuth(username=user, password=password))
system = root.get_system(os.environ["BMC_SYSTEM"])
print("power", system.power_state)
print("allowed", ",".join(sorted(str(v) for v in system.get_allowed_reset_system_values())))
system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
system.reset_system(sushy.RESET_ON)
system.refresh()
print("power", system.power_state)
print("boot", system.boot.target, system.boot.enabled)
print("nics", ",".join(n.mac_address for n in system.ethernet_interfaces.get_members()))
print("disk", system.simple_storage.disks_sizes_bytes)
system.reset_system(sushy.RESET_FORCE_OFF)
system.refresh()
print("power", system.power_state)
try:
    root.get_system("/redfish/v1/Systems/nope")
except sushy.exceptions.ResourceNotFoundError as e:
    print("missing", e.status_code)
