"""Remote robots: the robot-side server (``rlweave robot-server``, :mod:`rlweave.robot.server`) over a
:class:`~rlweave.robot.driver.RobotDriver`, the trainer-side env (``env.id: remote/<host>:<port>``,
:mod:`rlweave.robot.client`), their wire protocol (:mod:`rlweave.robot.protocol`), and human
interventions (:mod:`rlweave.robot.human`). Nothing is imported here: websockets, msgpack and
Pillow are the ``robot`` extra, loaded when used."""
