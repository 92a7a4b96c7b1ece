"""Drive a device from the workstation: ``vitdeploy <command> BUNDLE --on [USER@]HOST[:PORT]``.

The bundle is copied to the device over the user's own OpenSSH (only files whose sha256 changed,
against a hash manifest kept on the device), the command runs there with the device's vitdeploy,
its output streams back, and ``engines/<target>/`` and ``reports/`` come back into the local bundle
atomically. Nothing here imports more than the standard library and vitdeploy's light core.

* :mod:`.target`  - parsing ``[USER@]HOST[:PORT]`` and the ssh command line (BatchMode, port, extra options);
* :mod:`.agent`   - both ends of a copy: hash manifests, checked tar streams, and the device side's actions
                    (the hidden ``vitdeploy remote-agent``: hello, index, receive, send);
* :mod:`.session` - one remote run: check the device, copy what changed, run, bring the results back atomically;
* :mod:`.cli`     - the ``--on`` / ``--remote-vitdeploy`` / ``--remote-dir`` options shared by the commands.
"""
